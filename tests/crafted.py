"""Builders of crafted binaries for the reader tests: ELF field edits, .nv.info contents,
fatbins with LZ4 entries, offload bundles. Small and deterministic; no GPU needed."""
from __future__ import annotations

import struct

from kjit.formats import fatbin as containers
from kjit.formats.elf import ElfFile

# Offsets of the fields of an Elf64_Shdr and an Elf64_Sym.
SHDR = {"name": (0, "<I"), "type": (4, "<I"), "flags": (8, "<Q"), "offset": (24, "<Q"),
        "size": (32, "<Q"), "link": (40, "<I"), "info": (44, "<I"), "align": (48, "<Q"),
        "entsize": (56, "<Q")}
SYM = {"name": (0, "<I"), "info": (4, "<B"), "other": (5, "<B"), "shndx": (6, "<H"),
       "value": (8, "<Q"), "size": (16, "<Q")}


def section_index(code: bytes, name: str) -> int:
    return [s.name for s in ElfFile(code).sections].index(name)


def set_section(code: bytes, index: int, field: str, value: int) -> bytes:
    elf = ElfFile(code)
    at, fmt = SHDR[field]
    out = bytearray(code)
    struct.pack_into(fmt, out, elf.shoff + index * elf.shentsize + at, value)
    return bytes(out)


def symbol_index(code: bytes, name: str) -> int:
    return [s.name for s in ElfFile(code).symbols].index(name)


def set_symbol(code: bytes, k: int, field: str, value: int) -> bytes:
    symtab = next(s for s in ElfFile(code).sections if s.type == 2)  # SHT_SYMTAB
    at, fmt = SYM[field]
    out = bytearray(code)
    struct.pack_into(fmt, out, symtab.offset + 24 * k + at, value)
    return bytes(out)


def with_section_bytes(code: bytes, name: str, content: bytes) -> bytes:
    """`code` with section `name` holding `content` (no longer than it was) and resized."""
    elf = ElfFile(code)
    i = section_index(code, name)
    sec = elf.sections[i]
    assert len(content) <= sec.size
    out = bytearray(code)
    out[sec.offset:sec.offset + len(content)] = content
    return set_section(bytes(out), i, "size", len(content))


def patch_section(code: bytes, name: str, offset: int, value: bytes) -> bytes:
    """`code` with `value` written at `offset` into section `name`'s bytes."""
    sec = ElfFile(code).sections[section_index(code, name)]
    assert offset + len(value) <= sec.size
    out = bytearray(code)
    out[sec.offset + offset:sec.offset + offset + len(value)] = value
    return bytes(out)


def nvinfo_offset(code: bytes, name: str, attribute: int) -> int:
    """Where the value of the first `attribute` record of .nv.info section `name` starts."""
    sec = ElfFile(code).sections[section_index(code, name)]
    data, off = code[sec.offset:sec.offset + sec.size], 0
    while data[off + 1] != attribute:
        off += 4 + (struct.unpack_from("<H", data, off + 2)[0] if data[off] == 4 else 0)
    return off + 4


def many_symtabs(code: bytes, copies: int, stride: int = 0) -> bytes:
    """`code` plus `copies` more section headers, each another SHT_SYMTAB over the file's
    symbol table (shifted by `stride` bytes each): the crafted file of a quadratic reader."""
    elf = ElfFile(code)
    i = next(k for k, s in enumerate(elf.sections) if s.type == 2)  # SHT_SYMTAB
    raw = code[elf.shoff + i * 64:elf.shoff + i * 64 + 64]
    extra = bytearray()
    for k in range(copies):
        h = bytearray(raw)
        struct.pack_into("<Q", h, 24, elf.sections[i].offset + k * stride)
        extra += h
    out = bytearray(code) + extra
    table = bytearray(out[elf.shoff:elf.shoff + elf.shnum * 64]) + extra
    new_shoff = len(out)
    out += table
    struct.pack_into("<Q", out, 40, new_shoff)
    struct.pack_into("<H", out, 60, elf.shnum + copies)
    return bytes(out)


def lz4_run(declared: int) -> bytes:
    """An LZ4 block that decodes to `declared` bytes: one literal, then one long match."""
    rest = declared - 1 - 4 - 15
    body = b"\xff" * (rest // 255) + bytes([rest % 255])
    return bytes([0x1F]) + b"A" + b"\x01\x00" + body


def fatbin_entry(payload: bytes, *, kind: int = 2, sm: int = 90, flags: int = 0,
                 declared: int = 0, compressed: int = 0) -> bytes:
    hdr = containers._ENTRY.size
    flags |= containers.FLAG_64BIT | containers.FLAG_LINUX
    return containers._ENTRY.pack(kind, 0x101, hdr, len(payload), compressed, 0, 0, 9, sm, 0, 0,
                                  flags, 0, declared) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return containers._CONTAINER.pack(containers.FATBIN_MAGIC, 1, 16, len(body)) + body


def lz4_fatbin(*declared: int) -> bytes:
    """A fatbin of LZ4 cubin entries, each a small block declaring (and decoding to) its size."""
    out = []
    for i, size in enumerate(declared):
        block = lz4_run(size)
        out.append(fatbin_entry(block, sm=80 + i, flags=containers.FLAG_LZ4, declared=size,
                                compressed=len(block)))
    return fatbin(*out)


def bundle(entries: list[tuple[str, int, int]], tail: bytes) -> bytes:
    """A clang offload bundle whose entry table is (id, offset, size) as given, then `tail`."""
    out = bytearray(b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(entries)))
    for eid, off, size in entries:
        raw = eid.encode()
        out += struct.pack("<QQQ", off, size, len(raw)) + raw
    return bytes(out) + tail


def host_object(device_code: bytes) -> bytes:
    """A minimal x86-64 relocatable ELF whose .nv_fatbin section holds `device_code` (what
    nvcc -rdc embeds in a host object)."""
    shstr = b"\0.shstrtab\0.nv_fatbin\0"
    body = bytearray(64) + shstr
    while len(body) % 8:
        body += b"\0"
    fat_off = len(body)
    body += device_code
    while len(body) % 8:
        body += b"\0"
    shoff = len(body)
    headers = bytes(64)
    headers += struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(shstr), 0, 0, 1, 0)
    headers += struct.pack("<IIQQQQIIQQ", 11, 1, 2, 0, fat_off, len(device_code), 0, 0, 8, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0, 0]) + bytes(7)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)
    return header + bytes(body[64:]) + headers
