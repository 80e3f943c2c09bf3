"""Clang offload bundles: several AMD code objects (one per gfx target) in one file.

This is the `.hip_fatbin` format hipcc embeds and hipModuleLoadData accepts; the runtime
picks the entry whose target ID matches the device. Layout (all integers uint64 LE):

    "__CLANG_OFFLOAD_BUNDLE__"  number of entries
    per entry: offset, size, id length, id  (e.g. "hipv4-amdgcn-amd-amdhsa--gfx90a")
    the code objects, each at its offset (4096-aligned, as clang-offload-bundler does for HIP)

hipcc bundles always carry an empty host entry ("host-x86_64-unknown-linux--"); kjit
writes one too so its bundles look exactly like the compiler's to every reader.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

from .. import arch as arch_mod
from .elf import AMDGPU_MACH, EM_AMDGPU, ElfFile, ElfFormatError
from ..errors import InvalidOptionError

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
HOST_ENTRY_ID = "host-x86_64-unknown-linux--"
AMDGPU_TRIPLE = "amdgcn-amd-amdhsa-"
ALIGNMENT = 4096

# e_flags target-feature fields of code object v4+ (LLVM AMDGPUUsage, "EF_AMDGPU_FEATURE_*_V4").
_XNACK_MASK, _SRAMECC_MASK = 0x300, 0xC00
_FEATURE_SETTING = {0x1: None, 0x2: "-", 0x3: "+"}  # 0 unsupported, 1 any, 2 off, 3 on
ELFABIVERSION_AMDGPU_HSA_V4 = 2


@dataclass(frozen=True)
class Entry:
    """One entry of a container: kind ("hsaco", "host", "llvm-bc", "unknown"), target
    arch (gfx90a:xnack-; the triple for the host entry) and its bytes."""

    kind: str
    arch: str
    code: bytes
    entry_id: str = ""


def target_id(code: bytes) -> str:
    """The target ID of an AMD code object from its ELF header: gfx90a, gfx90a:xnack-, ...

    InvalidOptionError if the bytes are not an AMDGPU ELF or name an unknown gfx target.
    """
    try:
        elf = ElfFile(code)
    except ElfFormatError as exc:
        raise InvalidOptionError(f"not an AMD code object: {exc}") from None
    if elf.machine != EM_AMDGPU:
        raise InvalidOptionError(
            f"not an AMD code object: ELF machine {elf.machine}, expected EM_AMDGPU ({EM_AMDGPU})")
    processor = AMDGPU_MACH.get(elf.amdgpu_mach)
    if processor is None:
        raise InvalidOptionError(
            f"AMD code object for an unknown gfx target (EF_AMDGPU_MACH 0x{elf.amdgpu_mach:x}); "
            "kjit.elf.AMDGPU_MACH needs the entry")
    features = []
    if elf.abiversion >= ELFABIVERSION_AMDGPU_HSA_V4:
        for name, mask, shift in (("sramecc", _SRAMECC_MASK, 10), ("xnack", _XNACK_MASK, 8)):
            setting = _FEATURE_SETTING.get((elf.flags & mask) >> shift)
            if setting:
                features.append(name + setting)
    return ":".join([processor, *features])


def entry_id(target: str, code_object_v4: bool = True) -> str:
    """The bundle entry ID hipModuleLoadData matches against the device: hipv4-...--gfx90a."""
    return ("hipv4-" if code_object_v4 else "hip-") + AMDGPU_TRIPLE + "-" + target


def _entry_target(arch: str, code: bytes) -> tuple[str, bool]:
    """The target ID to record for `code`, checked against the arch the caller named."""
    given = arch_mod.parse(arch, "hip").name
    actual = target_id(code)
    given_proc, *given_feats = given.split(":")
    actual_proc, *actual_feats = actual.split(":")
    if given_proc != actual_proc:
        raise InvalidOptionError(
            f"bundle entry named {given!r} holds a code object for {actual}: a device would load "
            "code for the wrong GPU; pass the arch the object was compiled for")
    if given_feats and sorted(given_feats) != sorted(actual_feats):
        raise InvalidOptionError(
            f"bundle entry named {given!r} holds a code object compiled as {actual}")
    return actual, ElfFile(code).abiversion >= ELFABIVERSION_AMDGPU_HSA_V4


def write_bundle(objects: Iterable[tuple[str, bytes]]) -> bytes:
    """A clang offload bundle of AMD code objects, given as (arch, code object bytes) pairs.

    Each entry's ID comes from the code object's own ELF header (the arch given must agree),
    so a bundle can never label gfx908 code as gfx90a. An empty host entry comes first.
    """
    items = list(objects)
    if not items:
        raise InvalidOptionError("an offload bundle needs at least one code object")
    ids: list[str] = []
    codes: list[bytes] = []
    for pair in items:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise InvalidOptionError(f"bundle items are (arch, code) pairs, got {pair!r:.60}")
        arch, code = pair
        code = bytes(code)
        target, v4 = _entry_target(arch, code)
        eid = entry_id(target, v4)
        if eid in ids:
            raise InvalidOptionError(f"two code objects for {target}: a bundle holds one per target")
        ids.append(eid)
        codes.append(code)
    ids.insert(0, HOST_ENTRY_ID)
    codes.insert(0, b"")

    header_size = len(BUNDLE_MAGIC) + 8 + sum(24 + len(i.encode()) for i in ids)
    offsets, cursor = [], header_size
    for code in codes:
        cursor = -(-cursor // ALIGNMENT) * ALIGNMENT
        offsets.append(cursor)
        cursor += len(code)
    out = bytearray(BUNDLE_MAGIC + struct.pack("<Q", len(ids)))
    for eid, code, off in zip(ids, codes, offsets):
        raw = eid.encode()
        out += struct.pack("<QQQ", off, len(code), len(raw)) + raw
    for code, off in zip(codes, offsets):
        out += b"\0" * (off - len(out)) + code
    return bytes(out)


def _parse_id(eid: str) -> tuple[str, str, str]:
    """(offload kind, triple, target) of an entry ID such as hipv4-amdgcn-amd-amdhsa--gfx90a."""
    kind, _, rest = eid.partition("-")
    parts = rest.split("-")
    if len(parts) == 4 and parts[3].startswith("gfx"):  # code object v3: hip-amdgcn-amd-amdhsa-gfx906
        return kind, "-".join(parts[:3]), parts[3]
    return kind, "-".join(parts[:4]).rstrip("-"), "-".join(parts[4:])


def _entry_kind(offload_kind: str, code: bytes) -> str:
    if offload_kind == "host":
        return "host"
    if code.startswith(b"\x7fELF"):
        try:
            if ElfFile(code).machine == EM_AMDGPU:
                return "hsaco"
        except ElfFormatError:
            pass
    if code.startswith(b"BC\xc0\xde"):
        return "llvm-bc"
    return "unknown"


def read_bundle(code: bytes) -> list[Entry]:
    """The entries of a clang offload bundle, host entry included, in file order."""
    data = bytes(code)
    if data.startswith(COMPRESSED_MAGIC):
        raise InvalidOptionError(
            "compressed offload bundle (CCOB): kjit reads uncompressed bundles only; unpack it "
            "with `clang-offload-bundler --unbundle` or build without --offload-compress")
    if not data.startswith(BUNDLE_MAGIC):
        raise InvalidOptionError("not a clang offload bundle (no __CLANG_OFFLOAD_BUNDLE__ magic)")
    pos = len(BUNDLE_MAGIC)

    def take(fmt: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise InvalidOptionError("corrupt offload bundle: its entry table is truncated")
        values = struct.unpack_from(fmt, data, pos)
        pos += size
        return values

    (count,) = take("<Q")
    if count > 4096:
        raise InvalidOptionError(f"corrupt offload bundle: claims {count} entries")
    entries = []
    total = 0
    for _ in range(count):
        offset, size, id_len = take("<QQQ")
        if pos + id_len > len(data):
            raise InvalidOptionError("corrupt offload bundle: an entry ID runs past the end")
        eid = data[pos:pos + id_len].decode("utf-8", "replace")
        pos += id_len
        if offset + size > len(data):
            raise InvalidOptionError(
                f"corrupt offload bundle: entry {eid!r} runs past the end of the file "
                f"({offset}+{size} > {len(data)} bytes)")
        total += size
        if total > len(data):  # each entry is a copy: overlapping entries would multiply the file
            raise InvalidOptionError(
                f"corrupt offload bundle: its entries hold {total} bytes or more, more than the "
                f"{len(data)}-byte file (entries overlap)")
        body = data[offset:offset + size]
        offload_kind, triple, target = _parse_id(eid)
        kind = _entry_kind(offload_kind, body)
        entries.append(Entry(kind, target if kind != "host" else triple, body, eid))
    return entries
