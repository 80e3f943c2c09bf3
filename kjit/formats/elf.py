"""A small reader for ELF64 files: the header, sections and the symbol table.

Enough to sniff CUDA cubins (EM_CUDA) and AMD code objects (EM_AMDGPU), list their
kernels, and read the per-kernel .nv.info attributes, without a GPU or binutils.
"""
from __future__ import annotations

import bisect
import re
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
SHT_NOBITS = 8
# Section types that occupy no bytes of the file: SHT_NOBITS and CUDA's own .nv.global,
# .nv.local, .nv.shared.<kernel> and the reserved shared window.
NOBITS_TYPES = frozenset({SHT_NOBITS, 0x70000007, 0x70000009, 0x7000000A, 0x70000015})


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


class StringTable:
    """A string section, indexed once: each name is a bisect into the positions of its
    NULs, so reading N names costs O(N log N), never N scans of the section."""

    def __init__(self, data: bytes, start: int, size: int):
        end = min(start + size, len(data)) if size else start
        self.data, self.start, self.end = data, start, max(end, start)
        raw = data[self.start:self.end]
        self._nuls = [m.start() for m in re.finditer(b"\0", raw)]

    def __getitem__(self, index: int) -> str:
        if index >= self.end - self.start:
            return ""
        at = bisect.bisect_left(self._nuls, index)
        stop = self._nuls[at] if at < len(self._nuls) else self.end - self.start
        return self.data[self.start + index:self.start + stop].decode("utf-8", "replace")


class ElfFile:
    """A parsed ELF64 (little-endian) image held in memory.

    The bytes are untrusted: every read is bounded by the file, and each byte range is
    parsed a bounded number of times (one symbol table, sections that do not partly
    overlap), so the work is linear in the file's size. `kjit.formats.elfcheck` checks the
    rest of the structure a linker relies on."""

    def __init__(self, data: bytes):
        if len(data) < 64 or data[:4] != b"\x7fELF":
            raise ElfFormatError("not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise ElfFormatError("only 64-bit little-endian ELF is supported")
        self.data = bytes(data)
        (self.type, self.machine, _version, _entry, self.phoff, self.shoff, self.flags, _ehsize,
         self.phentsize, self.phnum, self.shentsize, self.shnum, self.shstrndx) = struct.unpack_from(
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
            if typ not in NOBITS_TYPES and size and off + size > len(self.data):
                raise ElfFormatError(f"section {i} ({off}+{size} bytes) lies outside the "
                                     f"{len(self.data)}-byte file (truncated?)")
            raw.append((name, typ, flags, off, size, link, info, entsize))
        _check_no_overlap(raw)
        if not raw:
            return []
        names = StringTable(self.data, raw[self.shstrndx][3], raw[self.shstrndx][4]) \
            if self.shstrndx < len(raw) and raw[self.shstrndx][1] not in NOBITS_TYPES else None
        return [Section(names[name] if names else "", typ, flags, off, size, link, info, entsize)
                for name, typ, flags, off, size, link, info, entsize in raw]

    @cached_property
    def _by_name(self) -> dict[str, Section]:
        out: dict[str, Section] = {}
        for s in self.sections:
            out.setdefault(s.name, s)
        return out

    def section(self, name: str) -> Section | None:
        return self._by_name.get(name)

    def section_bytes(self, sec: Section) -> bytes:
        if sec.type in NOBITS_TYPES:
            return b""
        return self.data[sec.offset:sec.offset + sec.size]

    @cached_property
    def symtab_index(self) -> int | None:
        """The index of the symbol table section; an ELF file has at most one."""
        found = [i for i, s in enumerate(self.sections) if s.type == SHT_SYMTAB]
        if len(found) > 1:
            raise ElfFormatError(f"{len(found)} symbol tables (SHT_SYMTAB sections); an ELF "
                                 "file has at most one")
        return found[0] if found else None

    @cached_property
    def symbols(self) -> list[Symbol]:
        secs = self.sections
        if self.symtab_index is None:
            return []
        sec = secs[self.symtab_index]
        if sec.link >= len(secs):
            return []
        strsec = secs[sec.link]
        strtab = StringTable(self.data, strsec.offset, strsec.size if strsec.type not in NOBITS_TYPES else 0)
        step = max(sec.entsize, 24)  # Elf64_Sym is 24 bytes
        out: list[Symbol] = []
        for off in range(sec.offset, sec.offset + sec.size - 23, step):
            name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", self.data, off)
            out.append(Symbol(strtab[name], value, size, info & 0xF, info >> 4, other, shndx))
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
        """Kernel entry points of a cubin: functions marked as CUDA entries (STO_CUDA_ENTRY).

        A device function (`__device__`, kept as a symbol in -rdc objects) is not one. Older
        cubins without the mark: functions whose .nv.info.<name> has the parameter-bank
        attributes only kernels carry."""
        funcs = [s for s in self.symbols if s.type == STT_FUNC and s.name]
        names = [s.name for s in funcs if s.other & STO_CUDA_ENTRY]
        if not names and funcs:
            from .nvrecords import has_kernel_attributes
            names = [s.name for s in funcs
                     if (sec := self.section(".nv.info." + s.name)) is not None
                     and has_kernel_attributes(self.section_bytes(sec))]
        return sorted(set(names))

    def amd_kernels(self) -> list[str]:
        """Kernels of an AMD code object: symbols with a matching '<name>.kd' descriptor."""
        names = {s.name for s in self.symbols}
        return sorted(n[:-3] for n in names if n.endswith(".kd"))



def _check_no_overlap(raw: list[tuple]) -> None:
    """Refuse sections whose bytes partly overlap. Two sections may name exactly the same
    bytes (sm_100+ cubins alias each debug section as .nv.merc.*); a reader that caches by
    byte range then parses each range once, however many sections name it."""
    spans = sorted({(off, off + size): i for i, (_n, typ, _f, off, size, *_r) in enumerate(raw)
                    if typ not in NOBITS_TYPES and size}.items())
    for ((_s0, end0), i0), ((start1, _e1), i1) in zip(spans, spans[1:]):
        if start1 < end0:
            raise ElfFormatError(f"sections {i0} and {i1} overlap (bytes {start1}..{end0}): "
                                 "the file is damaged or crafted")


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
