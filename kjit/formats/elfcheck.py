"""The structure a linker trusts in a CUDA ELF (cubin, relocatable object, host object).

nvJitLink and the driver's linker follow section and symbol indexes without checking
them: a cubin whose `.rela.debug_frame` names section 0xFFFFFFFF, whose `.text` names a
symbol that is not a function, or whose symbol table is misaligned crashes the process.
`check_linkable` checks every such index and range first and raises ElfFormatError naming
the section or symbol at fault; it reads each byte of the file a bounded number of times.
"""
from __future__ import annotations

import struct

from .elf import (EM_CUDA, NOBITS_TYPES, SHT_SYMTAB, STT_FUNC, ElfFile, ElfFormatError, Section)
from .nvrecords import PER_SYMBOL_CODES, NvInfoFormatError, parse_nvinfo

SHT_PROGBITS, SHT_STRTAB, SHT_RELA, SHT_REL, SHT_DYNSYM = 1, 3, 4, 9, 11
SHF_EXECINSTR, SHF_INFO_LINK = 0x4, 0x40
# Types whose sh_info names a section even without SHF_INFO_LINK: PROGBITS and .nv.info.
_INFO_IS_SECTION = (SHT_PROGBITS, 0x70000000, 0x70000083)
SHN_LORESERVE = 0xFF00
_ENTSIZE = {SHT_SYMTAB: 24, SHT_DYNSYM: 24, SHT_RELA: 24, SHT_REL: 16}
_PHDR_SIZE = 56
SHT_CUDA_INFO, SHT_CUDA_CALLGRAPH, SHT_CUDA_PROTOTYPE = 0x70000000, 0x70000001, 0x70000002
_KPARAM_INFO, _PARAM_CBANK = 0x17, 0x0A
# The record format of the attributes whose layout every toolkit shares (4 SVAL, 3 HVAL);
# a known attribute in another format is how a crafted record makes a linker misread it.
_FORMAT = {0x2F: 4, 0x11: 4, 0x12: 4, 0x23: 4, 0x17: 4, 0x0A: 4, 0x1C: 4, 0x37: 4, 0x19: 3, 0x1B: 3}
_CALLGRAPH_MARKS = 0xFFFFFFF0  # callgraph entries at or above this are markers, not symbols


def check_linkable(data: bytes) -> ElfFile:
    """The parsed ELF if a linker can safely read it; ElfFormatError says what is wrong."""
    elf = ElfFile(data)
    if elf.shnum == 0:
        raise ElfFormatError("no section headers (e_shnum 0): not a cubin or object a linker reads")
    if elf.shentsize != 64:
        raise ElfFormatError(f"section headers of {elf.shentsize} bytes; ELF64 has 64")
    if elf.shstrndx >= elf.shnum:
        raise ElfFormatError(f"e_shstrndx {elf.shstrndx} names no section (the file has {elf.shnum})")
    _check_segments(elf)
    secs = elf.sections  # ranges within the file, no two overlapping
    if secs[elf.shstrndx].type != SHT_STRTAB:
        raise ElfFormatError(f"section {elf.shstrndx}, named by e_shstrndx, is not a string table")
    symtab = elf.symtab_index  # at most one
    syms = elf.symbols
    seen: set = set()   # relocation tables already checked (headers may share one)
    for i, sec in enumerate(secs):
        if i:
            _check_section(elf, i, sec, symtab, len(syms), seen)
    if symtab is not None:
        _check_symbols(elf, symtab)
    if elf.machine == EM_CUDA:
        _check_cuda_tables(elf)
    return elf


def _where(i: int, sec: Section) -> str:
    return f"section {i} ({sec.name or 'unnamed'})"


def _check_segments(elf: ElfFile) -> None:
    if not elf.phnum:
        return
    if elf.phentsize != _PHDR_SIZE or elf.phoff + elf.phnum * _PHDR_SIZE > len(elf.data):
        raise ElfFormatError("program header table lies outside the file or has the wrong entry size")
    for k in range(elf.phnum):
        off, _vaddr, _paddr, filesz = struct.unpack_from("<QQQQ", elf.data, elf.phoff + k * _PHDR_SIZE + 8)
        if off + filesz > len(elf.data):
            raise ElfFormatError(f"segment {k} ({off}+{filesz} bytes) lies outside the "
                                 f"{len(elf.data)}-byte file")


def _check_section(elf: ElfFile, i: int, sec: Section, symtab: int | None, nsyms: int,
                   seen: set) -> None:
    n = elf.shnum
    where = _where(i, sec)
    if sec.link >= n:
        raise ElfFormatError(f"{where}: sh_link {sec.link} names no section (the file has {n})")
    align = struct.unpack_from("<Q", elf.data, elf.shoff + i * 64 + 48)[0]
    if align > 1 and (align & (align - 1) or (sec.type not in NOBITS_TYPES and sec.size and sec.offset % align)):
        raise ElfFormatError(f"{where}: offset {sec.offset} does not meet its alignment {align}")
    want = _ENTSIZE.get(sec.type)
    if want is not None and sec.offset % 8:
        raise ElfFormatError(f"{where}: table at offset {sec.offset}, not 8-byte aligned")
    if want is not None and sec.entsize != want:
        raise ElfFormatError(f"{where}: entries of {sec.entsize} bytes; this section type has {want}")
    if sec.entsize and sec.type not in NOBITS_TYPES and sec.size % sec.entsize:
        raise ElfFormatError(f"{where}: {sec.size} bytes is not a whole number of "
                             f"{sec.entsize}-byte entries")
    if sec.type in (SHT_REL, SHT_RELA):
        _check_relocations(elf, i, sec, symtab, nsyms, seen)
    elif sec.type == SHT_SYMTAB:
        if elf.sections[sec.link].type != SHT_STRTAB:
            raise ElfFormatError(f"{where}: sh_link {sec.link} is not a string table")
        if sec.info > nsyms:
            raise ElfFormatError(f"{where}: sh_info {sec.info} is past its {nsyms} symbols")
    elif elf.machine != EM_CUDA:
        return  # host objects: only their relocations and symbols are a CUDA linker's business
    elif sec.flags & SHF_EXECINSTR:
        # A CUDA code section's sh_info names its function's symbol (low 24 bits).
        index = sec.info & 0xFFFFFF
        if index >= nsyms or elf.symbols[index].type != STT_FUNC:
            raise ElfFormatError(f"{where}: sh_info names symbol {index}, which is not a function "
                                 f"(the symbol table has {nsyms})")
    elif (sec.flags & SHF_INFO_LINK or sec.type in _INFO_IS_SECTION) and sec.info >= n:
        # sh_info of these names a section; CUDA's own types keep other numbers there
        raise ElfFormatError(f"{where}: sh_info {sec.info} names no section (the file has {n})")


def _check_relocations(elf: ElfFile, i: int, sec: Section, symtab: int | None, nsyms: int,
                       seen: set) -> None:
    where = _where(i, sec)
    if sec.info >= elf.shnum:
        raise ElfFormatError(f"{where}: sh_info {sec.info} names no section to relocate "
                             f"(the file has {elf.shnum})")
    if sec.size and sec.link != symtab:
        raise ElfFormatError(f"{where}: sh_link {sec.link} is not the symbol table")
    step = _ENTSIZE[sec.type]
    if (sec.type, sec.offset, sec.size) in seen:   # the same entries under another header
        return
    seen.add((sec.type, sec.offset, sec.size))
    for off in range(sec.offset, sec.offset + sec.size, step):
        (r_info,) = struct.unpack_from("<Q", elf.data, off + 8)
        if r_info >> 32 >= max(nsyms, 1):
            raise ElfFormatError(f"{where}: a relocation at offset {off} names symbol "
                                 f"{r_info >> 32} of {nsyms}")


def _check_symbols(elf: ElfFile, symtab: int) -> None:
    secs = elf.sections
    strsize = secs[secs[symtab].link].size
    entry = secs[symtab].offset
    for k, sym in enumerate(elf.symbols):
        (st_name,) = struct.unpack_from("<I", elf.data, entry + 24 * k)
        if st_name and st_name >= strsize:
            raise ElfFormatError(f"symbol {k}: its name at {st_name} lies past the "
                                 f"{strsize}-byte string table")
        if sym.shndx >= elf.shnum:  # SHN_ABS, SHN_COMMON, SHN_XINDEX or no section at all
            if elf.machine == EM_CUDA or sym.shndx < SHN_LORESERVE:
                raise ElfFormatError(f"symbol {k} ({sym.name or 'unnamed'}): section index "
                                     f"0x{sym.shndx:x} names no section (the file has {elf.shnum})")
        elif elf.machine == EM_CUDA and sym.type == STT_FUNC and sym.shndx and \
                not secs[sym.shndx].flags & SHF_EXECINSTR:
            raise ElfFormatError(f"symbol {k} ({sym.name}): a function defined in section "
                                 f"{sym.shndx}, which holds no code")


def _check_cuda_tables(elf: ElfFile) -> None:
    """The symbol indexes inside CUDA's own sections, which the linkers follow unchecked:
    .nv.info records (every section's records well formed; per-function records of the
    global one naming functions), .nv.callgraph edges and .nv.prototype entries."""
    syms = elf.symbols

    def function(index: int, where: str) -> None:
        if index >= len(syms) or syms[index].type != STT_FUNC:
            raise ElfFormatError(f"{where} names symbol {index}, which is not a function "
                                 f"(the symbol table has {len(syms)})")

    checked: set[tuple] = set()
    for i, sec in enumerate(elf.sections):
        # Sections may cover the same bytes (sm_100 cubins do): each range is read once, so a
        # file of many headers over one table costs what the table does.
        what = (sec.type, sec.offset, sec.size, bool(sec.info) if sec.type == SHT_CUDA_INFO else None)
        if what in checked:
            continue
        checked.add(what)
        where = _where(i, sec)
        data = elf.section_bytes(sec)
        if sec.type == SHT_CUDA_INFO:
            try:
                records = parse_nvinfo(data)
            except NvInfoFormatError as exc:
                raise ElfFormatError(f"{where}: {exc}") from None
            for r in records:
                if _FORMAT.get(r.code, r.format) != r.format:
                    raise ElfFormatError(f"{where}: a {r.name} record in format {r.format}, "
                                         f"not {_FORMAT[r.code]}")
                if r.code == _PARAM_CBANK and (len(r.value) < 8 or
                                               int.from_bytes(r.value[:4], "little") >= len(syms)):
                    raise ElfFormatError(f"{where}: a PARAM_CBANK record names no symbol")
                if r.code in PER_SYMBOL_CODES and not sec.info:
                    if not isinstance(r.value, bytes) or len(r.value) < 8:
                        raise ElfFormatError(f"{where}: a {r.name} record without its symbol")
                    function(int.from_bytes(r.value[:4], "little"), f"{where}: a {r.name} record")
                if r.code == _KPARAM_INFO and (not isinstance(r.value, bytes) or len(r.value) < 12
                                               or int.from_bytes(r.value[:4], "little") > 0xFFFF):
                    raise ElfFormatError(f"{where}: a malformed KPARAM_INFO record")
        elif sec.type == SHT_CUDA_CALLGRAPH:
            # Pairs: (0, marker) opens a block; in the first (0xFFFFFFFF) block each pair is a
            # call edge (caller, callee), in the others (function, a number).
            block = 0
            for k in range(0, len(data) - 7, 8):
                first, second = struct.unpack_from("<II", data, k)
                if second >= _CALLGRAPH_MARKS:
                    if first:
                        raise ElfFormatError(f"{where}: the marker at offset {k} is malformed")
                    block = second
                    continue
                if first or block != 0xFFFFFFFF:
                    function(first, f"{where}: the entry at offset {k}")
                if block == 0xFFFFFFFF:
                    function(second, f"{where}: the call edge at offset {k}")
        elif sec.type == SHT_CUDA_PROTOTYPE:
            for k in range(0, len(data) - 7, 8):
                function(int.from_bytes(data[k:k + 4], "little"), f"{where}: the entry at offset {k}")
