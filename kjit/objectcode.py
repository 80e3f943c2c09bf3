"""ObjectCode: the immutable value that flows between compile, link, cache and load."""
from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .errors import InvalidOptionError
from .hashing import sha256
from .formats import KINDS

# The binary readers (kjit.formats.sniff, .elf) load when bytes must be read: a cache hit
# rebuilds an ObjectCode from a checked entry and reads nothing (~2.5 ms of a fresh process).

# Sidecar file next to a saved object that keeps what the bytes cannot: name-expression
# symbols, the source's declarations (parameter types) and the arch of a kind that does not
# record one (used by `kjit build` too).
SIDECAR_SUFFIX = ".kjit.json"


_FIELDS = ("code", "kind", "arch", "log", "symbols", "name", "metadata", "cache_hit")


class ObjectCode:
    """Compiled or linked code: bytes plus what kjit knows about them.

    Immutable. `kind` is one of ptx, cubin, object (relocatable cubin), ltoir, fatbin,
    hsaco (AMD code object), hipfb (clang offload bundle) or library (archive).
    """

    # A plain class, not a dataclass: `dataclasses` imports `inspect`, a quarter of what a
    # fresh process pays to hit the disk cache (docs/performance.md).
    code: bytes
    kind: str
    arch: str | None
    log: str
    symbols: Mapping[str, str]
    name: str
    metadata: Mapping[str, Any]
    cache_hit: bool | None

    def __init__(self, code: bytes, kind: str = "", arch: str | None = None, log: str = "",
                 symbols: Mapping[str, str] | None = None, name: str = "<source>",
                 metadata: Mapping[str, Any] | None = None, cache_hit: bool | None = None) -> None:
        if isinstance(code, str):  # PTX handed over as text
            code = code.encode()
        elif not isinstance(code, bytes):
            try:  # any buffer (bytearray, memoryview, numpy); bytes(5) would be five NULs
                code = bytes(memoryview(code))
            except TypeError:
                raise InvalidOptionError(
                    f"ObjectCode code must be bytes, got {type(code).__name__}") from None
        if not kind:
            from .formats import sniff_kind
            kind = sniff_kind(code)
        if kind not in KINDS:
            raise InvalidOptionError(f"unknown ObjectCode kind {kind!r}; one of {', '.join(KINDS)}")
        if kind in _ELF_KINDS:
            kind = _check_elf_kind(code, kind)
        if arch is None:
            from .formats import arch_from_bytes
            arch = arch_from_bytes(code, kind)
        self._fill(code, kind, arch, log, symbols, name, metadata, cache_hit)

    def _fill(self, code: bytes, kind: str, arch: str | None, log: str,
              symbols: Mapping[str, str] | None, name: str, metadata: Mapping[str, Any] | None,
              cache_hit: bool | None) -> None:
        """Set the fields of checked values (the only writes an ObjectCode takes)."""
        if kind == "ptx" and arch and arch.startswith("sm_"):
            # PTX is code for a virtual arch: PTX compiled for sm_90 is compute_90 code, and
            # is labelled so everywhere (compile, build, inspect, the cache).
            arch = "compute_" + arch[3:]
        for field_name, value in zip(_FIELDS, (
                code, kind, arch, log, MappingProxyType(dict(symbols or {})), name,
                MappingProxyType(dict(metadata or {})), cache_hit)):
            object.__setattr__(self, field_name, value)

    @classmethod
    def from_checked(cls, code: bytes, kind: str, arch: str | None, log: str,
                     symbols: Mapping[str, str], name: str, metadata: Mapping[str, Any],
                     cache_hit: bool | None) -> "ObjectCode":
        """An ObjectCode from fields another ObjectCode had, stored under a checksum (a cache
        entry): the bytes were read when it was made, so they are not read again."""
        if kind not in KINDS or not isinstance(code, bytes) or \
                (kind in _ELF_KINDS and not code.startswith(b"\x7fELF")):
            raise InvalidOptionError(f"not the fields of an ObjectCode (kind {kind!r})")
        obj = cls.__new__(cls)
        obj._fill(code, kind, arch, log, symbols, name, metadata, cache_hit)
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ObjectCode is immutable: use obj.with_({name}=...) for a changed copy")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ObjectCode is immutable")

    # --- what the bytes say -----------------------------------------------------------
    @cached_property
    def entry_points(self) -> tuple[str, ...]:
        """Names of the kernels this code defines (mangled where the source did not use extern "C")."""
        from .formats import ElfFile
        from .formats import PTX_ENTRY_RE
        if self.kind == "ptx":
            return tuple(m.decode() for m in PTX_ENTRY_RE.findall(self.code))
        if self.kind in ("cubin", "object"):
            return tuple(ElfFile(self.code).cuda_kernels())
        if self.kind == "hsaco":
            return tuple(ElfFile(self.code).amd_kernels())
        if self.kind in ("fatbin", "hipfb"):
            from .formats import fatbin_entries
            names: list[str] = []
            for entry in fatbin_entries(self.code, self.kind):
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
        from .formats import ptx_version
        return ptx_version(self.code) if self.kind == "ptx" else None

    @property
    def declarations(self) -> str:
        """The digest of the source's kernel signatures, structs and type aliases that kjit
        types parameters with at load time ("" for code that came without source). It goes
        wherever the code goes: link results, fatbins, save/from_file, the cache, pickle."""
        found = self.metadata.get("declarations")
        return found if isinstance(found, str) else ""

    def lowered_name(self, name: str) -> str:
        """The symbol for a name expression (`axpy<float>`), or the name itself."""
        return self.symbols.get(name, name)

    def with_(self, **changes: Any) -> "ObjectCode":
        """A copy with some fields changed (e.g. cache_hit). The bytes are read again only if
        the change is to them, their kind or their arch (arch=None: what the bytes say)."""
        values = {f: getattr(self, f) for f in _FIELDS}
        values.update(changes)
        cls = type(self)   # a LinkResult stays one
        if changes.keys() & {"code", "kind", "arch"}:
            return cls(**values)
        obj = cls.__new__(cls)
        obj._fill(**values)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        # The fields, not the instance dict: the mappings are read-only proxies (which pickle
        # refuses) and entry_points is cached there. Rebuilt without reading the bytes again.
        return (_unpickle, (type(self), self.code, self.kind, self.arch, self.log,
                            dict(self.symbols), self.name, dict(self.metadata), self.cache_hit))

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
    def save(self, path: str | os.PathLike[str], *, sidecar: bool = True) -> Path:
        """Write the bytes as a compiler writes its output (kjit.fileio: a regular file is
        replaced whole, a symlink's target is written, /dev/null or a FIFO is written
        through and never replaced); name-expression symbols and the source's declarations
        (the parameter types kjit.load needs) go to a `<path>.kjit.json` sidecar, which a
        special file cannot have. sidecar=False writes none (and removes one that an earlier
        save left, which would describe other bytes)."""
        from .fileio import write_file
        path = Path(path)
        if write_file(path, self.code):
            return path
        side = path.with_name(path.name + SIDECAR_SUFFIX)
        if sidecar and (self.symbols or self.declarations or _needs_arch_sidecar(self)):
            record = {"kind": self.kind, "arch": self.arch, "name": self.name,
                      "symbols": dict(self.symbols), "sha256": sha256(self.code).hexdigest()}
            if self.declarations:
                record["declarations"] = self.declarations
            write_file(side, json.dumps(record, indent=1, sort_keys=True).encode())
        elif side.is_symlink() or side.is_file():
            side.unlink()
        return path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], kind: str | None = None) -> "ObjectCode":
        """Read a file written by save() or any tool; the kind is sniffed unless given."""
        from .fileio import MAX_BINARY_BYTES, MAX_SIDECAR_BYTES, read_input
        path = Path(path)
        if not os.path.exists(path):
            raise InvalidOptionError(f"no such file: {path}")
        # Bounded, and only from a regular file: /dev/zero or a FIFO is refused, not read.
        code = read_input(path, MAX_BINARY_BYTES, "binary")
        side = path.with_name(path.name + SIDECAR_SUFFIX)
        meta: dict[str, Any] = {}
        if side.exists():
            try:
                meta = json.loads(read_input(side, MAX_SIDECAR_BYTES, "sidecar"))
            except (InvalidOptionError, ValueError, RecursionError):
                meta = {}
            # A sidecar describes the bytes it was written with; one left behind by a file
            # another tool has since replaced describes nothing. Nor does one whose fields
            # are not what save() writes.
            if not _usable_sidecar(meta, code):
                meta = {}
        decls = meta.get("declarations")
        return cls(code, kind=kind or "", arch=meta.get("arch"), symbols=meta.get("symbols", {}),
                   name=meta.get("name") or path.name,
                   metadata={"declarations": decls} if decls else None)


# Another library's compiled code (cuda.core's ObjectCode, from cuda.core or
# cuda.core.experimental): its `code_type` names -> kjit kinds. cuda.core's "object" is a
# linker input of either ELF kind, so its kind comes from the bytes.
_FOREIGN_KINDS = {"ptx": "ptx", "cubin": "cubin", "fatbin": "fatbin", "ltoir": "ltoir",
                  "object": "", "library": "library"}


def is_foreign_code(value: Any) -> bool:
    """Whether `value` is another library's compiled-code object: it has a `code_type` string
    and a `code` (cuda.core's ObjectCode and its look-alikes)."""
    return (not isinstance(value, ObjectCode) and isinstance(getattr(value, "code_type", None), str)
            and hasattr(value, "code"))


def from_foreign_code(value: Any) -> ObjectCode:
    """An ObjectCode from another library's compiled-code object: its `code` (bytes, or the
    path of a file, as cuda.core's `ObjectCode.from_cubin(path)` keeps it), `code_type`,
    `name` and `symbol_mapping` (name expression -> lowered name, str or bytes; older
    cuda.core releases keep it as `_sym_map` only)."""
    code_type = str(value.code_type).lower()
    if code_type not in _FOREIGN_KINDS:
        raise InvalidOptionError(
            f"{type(value).__name__} with code_type {code_type!r}: kjit takes "
            f"{', '.join(_FOREIGN_KINDS)} code")
    kind = _FOREIGN_KINDS[code_type]
    name = str(getattr(value, "name", "") or "")
    symbols: dict[str, str] = {}
    mapping = getattr(value, "symbol_mapping", None) or getattr(value, "_sym_map", None) or {}
    for expr, lowered in dict(mapping).items():
        if lowered is not None:   # cuda.core keeps None for an expression NVRTC did not lower
            symbols[_text(expr)] = _text(lowered)
    code = value.code
    if isinstance(code, (str, os.PathLike)):
        obj = ObjectCode.from_file(code, kind=kind or None)
        return obj.with_(symbols={**obj.symbols, **symbols}, name=name or obj.name)
    return ObjectCode(code, kind=kind, symbols=symbols, name=name or f"<{code_type}>")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def from_text_or_path(value: str | os.PathLike[str], what: str) -> ObjectCode:
    """kjit.load's and kjit.link's reading of a str: the path of a file, unless it is PTX
    text (what cuda.core, CuPy and PyCUDA users hand over). A str with a line break is text;
    one without is a path when such a file exists. CUDA source text is refused with how to
    compile it; `what` names the caller in messages."""
    if isinstance(value, os.PathLike):
        return ObjectCode.from_file(value)
    multiline = "\n" in value or "\0" in value
    if not multiline:
        try:
            if os.path.isfile(value):
                return ObjectCode.from_file(value)
        except (OSError, ValueError):   # too long to be a path
            pass
    if _is_ptx_text(value):
        return ObjectCode(value.encode(), kind="ptx", name="inline.ptx")
    if multiline or any(mark in value for mark in ("__global__", "#include", 'extern "C"')):
        source = "__global__" in value or "#include" in value or "#define" in value
        raise InvalidOptionError(
            f"{what} got a string that is neither PTX nor the path of a file"
            + (": it looks like CUDA C++ source; compile it first, e.g. "
               + _COMPILE_FIRST.get(what, f"{what}(kjit.compile(source))") if source else
               ": pass PTX text, compiled code (kjit.ObjectCode, bytes) or a file path"))
    return ObjectCode.from_file(value)   # says: no such file


_COMPILE_FIRST = {"kjit.link": 'kjit.link([kjit.compile(source, target="ltoir"), ...])'}


def _is_ptx_text(text: str) -> bool:
    """PTX: its first statement (after comments and blank lines) is a PTX directive such as
    .version, or a .version and a .target come early, as the kind sniffer reads bytes."""
    from .formats import PTX_TARGET_RE, PTX_VERSION_RE
    head = text[:4096].encode(errors="replace")
    if PTX_VERSION_RE.search(head) and PTX_TARGET_RE.search(head):
        return True
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("//"):
            return line.startswith((".version", ".target"))
    return False


def merge_declarations(digests: Iterable[str]) -> str:
    """One declarations digest for code made of several sources (a link, a fatbin): each
    distinct digest once, in order. A digest is C declarations, so one after another
    declares the union; a struct two sources share is declared alike in both."""
    seen: list[str] = []
    for d in digests:
        if d and d not in seen:
            seen.append(d)
    return "\n".join(seen)


def _unpickle(cls: type, code: bytes, kind: str, arch: str | None, log: str,
              symbols: Mapping[str, str], name: str, metadata: Mapping[str, Any],
              cache_hit: bool | None) -> ObjectCode:
    return cls.from_checked(code, kind, arch, log, symbols, name, metadata, cache_hit)


def _usable_sidecar(meta: Any, code: bytes) -> bool:
    if not isinstance(meta, dict):
        return False
    if "sha256" in meta and meta["sha256"] != sha256(code).hexdigest():
        return False
    symbols = meta.get("symbols", {})
    return (isinstance(meta.get("arch"), (str, type(None))) and isinstance(meta.get("name"), (str, type(None)))
            and isinstance(meta.get("declarations", ""), str)
            and isinstance(symbols, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in symbols.items()))


_ELF_KINDS = ("cubin", "object", "hsaco")


def _check_elf_kind(code: bytes, kind: str) -> str:
    """The kind an ELF image really is, given the kind claimed for it.

    cubin and object differ only in e_type (a relocatable cubin, e.g. from -rdc, is an
    object); that follows the bytes, so a saved and reloaded object keeps its kind.
    """
    try:
        from .formats import sniff_kind
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
    from .formats import arch_from_bytes
    found = arch_from_bytes(obj.code, obj.kind)
    if obj.kind == "ptx" and found is not None:
        return obj.arch.replace("sm_", "compute_", 1) != found
    return obj.arch != found
