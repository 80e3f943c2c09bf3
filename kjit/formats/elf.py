"""A small reader for ELF64 files: the header, sections and the symbol table.

Enough to sniff CUDA cubins (EM_CUDA) and AMD code objects (EM_AMDGPU), list their
kernels, and read the per-kernel .nv.info attributes, without a GPU or binutils.
"""
from __future__ import annotations

import struct
from functools import cached_property
from typing import NamedTuple

from ..errors import InvalidOptionError

EM_CUDA = 190
EM_AMDGPU = 224
ET_REL, ET_EXEC, ET_DYN = 1, 2, 3
STT_FUNC = 2
STT_OBJECT = 1
STB_GLOBAL = 1
STO_CUDA_ENTRY = 0x10
SHT_SYMTAB = 2


class ElfFormatError(InvalidOptionError):
    """The bytes are not a well-formed ELF64 little-endian file (a KjitError and a ValueError)."""


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


class Symbol(NamedTuple):
    name: str
    value: int
    size: int
    type: int
    bind: int
    other: int
    shndx: int


class ElfFile:
    """A parsed ELF64 (little-endian) image held in memory."""

    def __init__(self, data: bytes):
        if len(data) < 64 or data[:4] != b"\x7fELF":
            raise ElfFormatError("not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise ElfFormatError("only 64-bit little-endian ELF is supported")
        self.data = bytes(data)
        (self.type, self.machine, _version, _entry, _phoff, self.shoff, self.flags, _ehsize,
         _phentsize, _phnum, self.shentsize, self.shnum, self.shstrndx) = struct.unpack_from(
            "<HHIQQQIHHHHHH", data, 16)
        self.osabi = data[7]
        self.abiversion = data[8]
        end = self.shoff + self.shnum * self.shentsize
        if self.shnum and (self.shentsize < 64 or end > len(data)):
            raise ElfFormatError("section header table lies outside the file (truncated?)")

    @cached_property
    def sections(self) -> list[Section]:
        raw = []
        for i in range(self.shnum):
            name, typ, flags, _addr, off, size, link, info, _align, entsize = struct.unpack_from(
                "<IIQQQQIIQQ", self.data, self.shoff + i * self.shentsize)
            raw.append((name, typ, flags, off, size, link, info, entsize))
        if not raw:
            return []
        strtab = raw[self.shstrndx] if self.shstrndx < len(raw) else None
        out = []
        for name, typ, flags, off, size, link, info, entsize in raw:
            out.append(Section(self._str(strtab, name), typ, flags, off, size, link, info, entsize))
        return out

    def _str(self, strtab, index: int) -> str:
        if strtab is None:
            return ""
        start = strtab[3] + index
        end = self.data.find(b"\0", start, strtab[3] + strtab[4])
        return self.data[start:end if end >= 0 else start].decode("utf-8", "replace")

    def section(self, name: str) -> Section | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def section_bytes(self, sec: Section) -> bytes:
        if sec.type == 8:  # SHT_NOBITS
            return b""
        return self.data[sec.offset:sec.offset + sec.size]

    @cached_property
    def symbols(self) -> list[Symbol]:
        secs = self.sections
        out: list[Symbol] = []
        for sec in secs:
            if sec.type != SHT_SYMTAB or sec.link >= len(secs):
                continue
            if sec.offset + sec.size > len(self.data):
                raise ElfFormatError("symbol table lies outside the file (truncated?)")
            strsec = secs[sec.link]
            strtab = (0, 0, 0, strsec.offset, strsec.size)
            step = max(sec.entsize, 24)  # Elf64_Sym is 24 bytes
            for off in range(sec.offset, sec.offset + sec.size - 23, step):
                name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.data, off)
                out.append(Symbol(self._str(strtab, name), value, size, info & 0xF, info >> 4,
                                  other, shndx))
        return out

    @property
    def cuda_sm(self) -> int:
        """The SM number of a CUDA ELF (90 for sm_90) from e_flags."""
        # ELF ABI version 8 (CUDA 12.8+) moved the SM number to bits 8..15.
        if self.abiversion >= 8:
            return (self.flags >> 8) & 0xFF
        return self.flags & 0xFF

    @property
    def amdgpu_mach(self) -> int:
        """EF_AMDGPU_MACH: the gfx target id in e_flags of an AMD code object."""
        return self.flags & 0xFF

    def cuda_kernels(self) -> list[str]:
        """Kernel entry points of a cubin: global functions marked as CUDA entries."""
        names = [s.name for s in self.symbols
                 if s.type == STT_FUNC and s.other & STO_CUDA_ENTRY and s.name]
        if not names:  # older cubins: every function with a .nv.info.<name> section
            info = {s.name[len(".nv.info."):] for s in self.sections if s.name.startswith(".nv.info.")}
            names = [s.name for s in self.symbols if s.type == STT_FUNC and s.name in info]
        return sorted(set(names))

    def amd_kernels(self) -> list[str]:
        """Kernels of an AMD code object: symbols with a matching '<name>.kd' descriptor."""
        names = {s.name for s in self.symbols}
        return sorted(n[:-3] for n in names if n.endswith(".kd"))


# EF_AMDGPU_MACH values (e_flags & 0xFF) of AMD code objects, from LLVM's ELF.h /
# AMDGPUUsage "EF_AMDGPU_MACH" table. The tests compile every target the installed hiprtc
# supports and check the e_flags of the result against this table.
AMDGPU_MACH = {
    0x20: "gfx600", 0x21: "gfx601", 0x22: "gfx700", 0x23: "gfx701", 0x24: "gfx702",
    0x25: "gfx703", 0x26: "gfx704", 0x28: "gfx801", 0x29: "gfx802", 0x2A: "gfx803",
    0x2B: "gfx810", 0x2C: "gfx900", 0x2D: "gfx902", 0x2E: "gfx904", 0x2F: "gfx906",
    0x30: "gfx908", 0x31: "gfx909", 0x32: "gfx90c", 0x33: "gfx1010", 0x34: "gfx1011",
    0x35: "gfx1012", 0x36: "gfx1030", 0x37: "gfx1031", 0x38: "gfx1032", 0x39: "gfx1033",
    0x3A: "gfx602", 0x3B: "gfx705", 0x3C: "gfx805", 0x3D: "gfx1035", 0x3E: "gfx1034",
    0x3F: "gfx90a", 0x40: "gfx940", 0x41: "gfx1100", 0x42: "gfx1013", 0x43: "gfx1150",
    0x44: "gfx1103", 0x45: "gfx1036", 0x46: "gfx1101", 0x47: "gfx1102", 0x48: "gfx1200",
    0x4A: "gfx1151", 0x4B: "gfx941", 0x4C: "gfx942", 0x4E: "gfx1201", 0x4F: "gfx950",
    0x55: "gfx1152",
}
