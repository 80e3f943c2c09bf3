"""ObjectCode: the immutable value that flows between compile, link, cache and load."""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .elf import EM_AMDGPU, EM_CUDA, ET_REL, ElfFile, ElfFormatError
from .errors import InvalidOptionError

FATBIN_MAGIC = b"\x50\xed\x55\xba"      # 0xBA55ED50, little-endian
LTOIR_MAGIC = b"\xed\x43\x4e\x7f"       # 0x7F4E43ED, NVVM LTO-IR
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
ARCHIVE_MAGIC = b"!<arch>\n"

KINDS = ("ptx", "cubin", "ltoir", "fatbin", "hsaco", "hipfb", "object", "library")

_PTX_ENTRY_RE = re.compile(rb"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([A-Za-z_$][\w$]*)", re.M)
_PTX_TARGET_RE = re.compile(rb"^\s*\.target\s+([\w]+)", re.M)
_PTX_VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+)\.(\d+)", re.M)

# Sidecar file next to a saved object that keeps what the bytes cannot: name-expression
# symbols and the arch of a kind that does not record one (used by `kjit build` too).
SIDECAR_SUFFIX = ".kjit.json"


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
    if _PTX_VERSION_RE.search(code[:4096]) and _PTX_TARGET_RE.search(code[:4096]):
        return "ptx"
    raise InvalidOptionError(
        "unrecognised binary: not PTX, cubin, fatbin, LTO-IR, an AMD code object, an offload "
        "bundle or an archive")


def ptx_version(code: bytes) -> tuple[int, int] | None:
    """The `.version` of PTX text, e.g. (9, 5)."""
    m = _PTX_VERSION_RE.search(code)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True, eq=False)
class ObjectCode:
    """Compiled or linked code: bytes plus what kjit knows about them.

    Immutable. `kind` is one of ptx, cubin, object (relocatable cubin), ltoir, fatbin,
    hsaco (AMD code object), hipfb (clang offload bundle) or library (archive).
    """

    code: bytes
    kind: str = ""
    arch: str | None = None
    log: str = ""
    symbols: Mapping[str, str] = field(default_factory=dict)
    name: str = "<source>"
    metadata: Mapping[str, Any] = field(default_factory=dict)
    cache_hit: bool | None = None

    def __post_init__(self) -> None:
        code = self.code
        if isinstance(code, str):  # PTX handed over as text
            code = code.encode()
        elif not isinstance(code, bytes):
            try:  # any buffer (bytearray, memoryview, numpy); bytes(5) would be five NULs
                code = bytes(memoryview(code))
            except TypeError:
                raise InvalidOptionError(
                    f"ObjectCode code must be bytes, got {type(self.code).__name__}") from None
        object.__setattr__(self, "code", code)
        kind = self.kind or sniff_kind(code)
        if kind not in KINDS:
            raise InvalidOptionError(f"unknown ObjectCode kind {kind!r}; one of {', '.join(KINDS)}")
        if kind in _ELF_KINDS:
            kind = _check_elf_kind(code, kind)
        object.__setattr__(self, "kind", kind)
        if self.arch is None:
            object.__setattr__(self, "arch", _arch_from_bytes(code, kind))
        object.__setattr__(self, "symbols", MappingProxyType(dict(self.symbols)))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    # --- what the bytes say -----------------------------------------------------------
    @cached_property
    def entry_points(self) -> tuple[str, ...]:
        """Names of the kernels this code defines (mangled where the source did not use extern "C")."""
        if self.kind == "ptx":
            return tuple(m.decode() for m in _PTX_ENTRY_RE.findall(self.code))
        if self.kind in ("cubin", "object"):
            return tuple(ElfFile(self.code).cuda_kernels())
        if self.kind == "hsaco":
            return tuple(ElfFile(self.code).amd_kernels())
        if self.kind in ("fatbin", "hipfb"):
            from . import containers
            names: list[str] = []
            for entry in containers.entries(self.code, self.kind):
                try:
                    for n in ObjectCode(entry.code, kind=entry.kind).entry_points:
                        if n not in names:
                            names.append(n)
                except Exception:  # compressed or foreign entries are skipped
                    continue
            return tuple(names)
        return ()

    @property
    def ptx_version(self) -> tuple[int, int] | None:
        return ptx_version(self.code) if self.kind == "ptx" else None

    def lowered_name(self, name: str) -> str:
        """The symbol for a name expression (`axpy<float>`), or the name itself."""
        return self.symbols.get(name, name)

    def with_(self, **changes: Any) -> "ObjectCode":
        """A copy with some fields changed (e.g. cache_hit)."""
        return replace(self, **changes)

    def __repr__(self) -> str:
        return (f"ObjectCode(kind={self.kind!r}, arch={self.arch!r}, name={self.name!r}, "
                f"{len(self.code)} bytes)")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObjectCode):
            return NotImplemented
        return (self.code, self.kind, self.arch, dict(self.symbols)) == (
            other.code, other.kind, other.arch, dict(other.symbols))

    def __hash__(self) -> int:
        return hash((self.code, self.kind, self.arch))

    # --- files ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the bytes; name-expression symbols go to a `<path>.kjit.json` sidecar."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.code)
        os.replace(tmp, path)
        side = path.with_name(path.name + SIDECAR_SUFFIX)
        if self.symbols or _needs_arch_sidecar(self):
            side.write_text(json.dumps({"kind": self.kind, "arch": self.arch, "name": self.name,
                                        "symbols": dict(self.symbols),
                                        "sha256": hashlib.sha256(self.code).hexdigest()},
                                       indent=1, sort_keys=True))
        elif side.exists():
            side.unlink()
        return path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], kind: str | None = None) -> "ObjectCode":
        """Read a file written by save() or any tool; the kind is sniffed unless given."""
        path = Path(path)
        try:
            code = path.read_bytes()
        except FileNotFoundError:
            raise InvalidOptionError(f"no such file: {path}") from None
        except OSError as exc:
            raise InvalidOptionError(f"cannot read {path}: {exc.strerror or exc}") from None
        side = path.with_name(path.name + SIDECAR_SUFFIX)
        meta: dict[str, Any] = {}
        if side.exists():
            try:
                meta = json.loads(side.read_text())
            except ValueError:
                meta = {}
            # A sidecar describes the bytes it was written with; one left behind by a file
            # another tool has since replaced describes nothing.
            if not isinstance(meta, dict) or (
                    "sha256" in meta and meta["sha256"] != hashlib.sha256(code).hexdigest()):
                meta = {}
        return cls(code, kind=kind or "", arch=meta.get("arch"), symbols=meta.get("symbols", {}),
                   name=meta.get("name") or path.name)


_ELF_KINDS = ("cubin", "object", "hsaco")


def _check_elf_kind(code: bytes, kind: str) -> str:
    """The kind an ELF image really is, given the kind claimed for it.

    cubin and object differ only in e_type (a relocatable cubin, e.g. from -rdc, is an
    object); that follows the bytes, so a saved and reloaded object keeps its kind.
    """
    try:
        actual = sniff_kind(code)
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"kind={kind!r} but the bytes are not a valid ELF image: {exc}") from None
    if actual in ("cubin", "object") and kind in ("cubin", "object"):
        return actual
    if actual != kind:
        raise InvalidOptionError(f"kind={kind!r} but the bytes are {actual!r} code")
    return kind


def _needs_arch_sidecar(obj: ObjectCode) -> bool:
    """True when the bytes alone would not give back obj.arch: LTO-IR and fatbins record
    none, and a cubin's e_flags lose the 'a'/'f' suffix. PTX compiled for sm_90 reads back
    as compute_90, which says the same thing: no sidecar for that."""
    if obj.arch is None:
        return False
    found = _arch_from_bytes(obj.code, obj.kind)
    if obj.kind == "ptx" and found is not None:
        return obj.arch.replace("sm_", "compute_", 1) != found
    return obj.arch != found


def _arch_from_bytes(code: bytes, kind: str) -> str | None:
    if kind in ("cubin", "object"):
        return f"sm_{ElfFile(code).cuda_sm}"
    if kind == "ptx":
        m = _PTX_TARGET_RE.search(code)
        if m:
            t = m.group(1).decode()
            return t.replace("sm_", "compute_", 1) if t.startswith("sm_") else t
    if kind == "hsaco":
        from .elf import AMDGPU_MACH
        return AMDGPU_MACH.get(ElfFile(code).amdgpu_mach)
    return None
