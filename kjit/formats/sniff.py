"""What a blob of code is, from its bytes alone: its kind, its target arch, its PTX version."""
from __future__ import annotations

import re

from ..errors import InvalidOptionError
from . import KINDS  # noqa: F401  (re-exported)
from .elf import AMDGPU_MACH, EM_AMDGPU, EM_CUDA, ET_REL, ElfFile, ElfFormatError

FATBIN_MAGIC = b"\x50\xed\x55\xba"      # 0xBA55ED50, little-endian
LTOIR_MAGIC = b"\xed\x43\x4e\x7f"       # 0x7F4E43ED, NVVM LTO-IR
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
ARCHIVE_MAGIC = b"!<arch>\n"

PTX_ENTRY_RE = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$][\w$]*)", re.M)
PTX_TARGET_RE = re.compile(rb"^\s*\.target\s+([\w]+)", re.M)
PTX_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)

def sniff_kind(code: bytes) -> str:
    """The kind of a binary from its first bytes; InvalidOptionError if it is none we know."""
    head = bytes(code[:64])
    if head.startswith(FATBIN_MAGIC):
        return "fatbin"
    if head.startswith(LTOIR_MAGIC):
        return "ltoir"
    if head.startswith(BUNDLE_MAGIC):
        return "hipfb"
    if head.startswith(ARCHIVE_MAGIC):
        return "library"
    if head.startswith(b"\x7fELF"):
        try:
            elf = ElfFile(code)
        except ElfFormatError as exc:
            raise InvalidOptionError(f"corrupt ELF image: {exc}") from None
        if elf.machine == EM_CUDA:
            return "object" if elf.type == ET_REL else "cubin"
        if elf.machine == EM_AMDGPU:
            return "hsaco"
        raise InvalidOptionError(f"ELF image for machine {elf.machine} is neither CUDA nor AMDGPU")
    if PTX_VERSION_RE.search(code[:4096]) and PTX_TARGET_RE.search(code[:4096]):
        return "ptx"
    raise InvalidOptionError(
        "unrecognised binary: not PTX, cubin, fatbin, LTO-IR, an AMD code object, an offload "
        "bundle or an archive")


def ptx_version(code: bytes) -> tuple[int, int] | None:
    """The `.version` of PTX text, e.g. (9, 5)."""
    m = PTX_VERSION_RE.search(code)
    return (int(m.group(1)), int(m.group(2))) if m else None


def arch_from_bytes(code: bytes, kind: str) -> str | None:
    if kind in ("cubin", "object"):
        return f"sm_{ElfFile(code).cuda_sm}"
    if kind == "ptx":
        m = PTX_TARGET_RE.search(code)
        if m:
            t = m.group(1).decode()
            return t.replace("sm_", "compute_", 1) if t.startswith("sm_") else t
    if kind == "hsaco":
        return AMDGPU_MACH.get(ElfFile(code).amdgpu_mach)
    return None
