"""Link inputs: ObjectCode, bytes or a file path, normalised to one record each."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

from ..formats import ElfFile, ElfFormatError
from ..errors import InvalidOptionError
from ..fileio import MAX_BINARY_BYTES, read_input
from ..objectcode import ObjectCode, from_foreign_code, from_text_or_path, is_foreign_code

InputLike = Union[ObjectCode, bytes, bytearray, memoryview, str, "os.PathLike[str]"]

# kjit kinds a CUDA linker takes. "object" is kjit's relocatable cubin; "hostobject" is a
# host ELF (.o from nvcc -rdc) with embedded device code, the driver's CU_JIT_INPUT_OBJECT.
LINKABLE = ("ptx", "cubin", "object", "fatbin", "ltoir", "library", "hostobject")
_SUFFIX = {"ptx": ".ptx", "cubin": ".cubin", "object": ".cubin", "fatbin": ".fatbin",
           "ltoir": ".ltoir", "library": ".a", "hostobject": ".o"}
_HOST_MACHINES = {62: "x86-64", 183: "aarch64", 21: "ppc64"}
_RELEASE_RE = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+)")
_PTX_EXTERN_RE = re.compile(
    rb"\.extern\s+\.(?:func|global|const|shared)\s+(?:\([^)]*\)\s*)?(?:\.\w+\s+(?:\d+\s+)?)*([A-Za-z_$][\w$]*)")


@dataclass(frozen=True)
class LinkInput:
    """One input as the linkers see it."""

    code: bytes
    kind: str                     # one of LINKABLE
    name: str                     # unique among the inputs; what the linker logs call it
    digest: str                   # content hash for the cache key
    arch: str | None = None
    path: Path | None = None      # linked from this file (cuLinkAddFile / nvJitLinkAddFile)
    symbols: Mapping[str, str] = field(default_factory=dict)
    label: str = ""               # how errors name it: "#0 (kernel.cu)", "#1 (bytes)", its path
    declarations: str = ""        # the source's kernel signatures (ObjectCode.declarations)

    def external_references(self) -> set[str] | None:
        """Symbols this input uses but leaves to others (None where the bytes cannot tell)."""
        if self.kind == "ptx":
            return {m.decode() for m in _PTX_EXTERN_RE.findall(self.code)}
        if self.kind in ("cubin", "object"):
            return {s.name for s in ElfFile(self.code).symbols
                    if s.shndx == 0 and s.name and s.bind == 1}  # STB_GLOBAL, undefined
        return None

    @property
    def toolkit_version(self) -> int | None:
        """The CUDA release (13050) whose ptxas built a cubin, from its .note.nv.tkinfo."""
        if self.kind not in ("cubin", "object"):
            return None
        elf = ElfFile(self.code)
        note = elf.section(".note.nv.tkinfo")
        m = _RELEASE_RE.search(elf.section_bytes(note)) if note else None
        return 1000 * int(m.group(1)) + 10 * int(m.group(2)) if m else None

    @property
    def ptx_version(self) -> tuple[int, int] | None:
        if self.kind != "ptx":
            return None
        from ..formats import ptx_version
        return ptx_version(self.code)


def _host_object(code: bytes) -> bool:
    """True for a host ELF with embedded device code; InvalidOptionError for one without."""
    if not code.startswith(b"\x7fELF"):
        return False
    try:
        elf = ElfFile(code)
    except ElfFormatError:
        return False
    if elf.machine not in _HOST_MACHINES:
        return False
    if elf.section(".nv_fatbin") is None and elf.section("__nv_relfatbin") is None:
        raise InvalidOptionError(
            f"a {_HOST_MACHINES[elf.machine]} host object with no device code (.nv_fatbin "
            "section): compile it with nvcc -rdc=true, or link CUDA code (PTX, cubin, fatbin, "
            "LTO-IR, archives)")
    return True


def check_structure(code: bytes, kind: str) -> None:
    """Refuse bytes that would crash a linker. nvJitLink and cuLink trust a cubin's section
    and symbol indexes (a bad sh_info is a segfault) and a fatbin's entry headers (an LZ4
    entry that decodes past its declared size): every ELF, and every cubin inside a fatbin
    or host object, is checked first (kjit.formats.elfcheck)."""
    from ..formats import check_linkable
    from ..formats import read_fatbin
    if kind in ("cubin", "object", "hostobject"):
        try:
            elf = check_linkable(code)
        except ElfFormatError as exc:
            raise ElfFormatError(f"corrupt ELF, not linked: {exc}") from None
        if kind != "hostobject":
            return
        sec = elf.section(".nv_fatbin") or elf.section("__nv_relfatbin")
        code, kind = (elf.section_bytes(sec), "fatbin") if sec is not None else (b"", "")
    if kind == "fatbin":
        for i, entry in enumerate(read_fatbin(code)):
            if entry.kind == "cubin" and entry.decoded:
                try:
                    check_linkable(entry.code)
                except ElfFormatError as exc:
                    raise ElfFormatError(f"corrupt ELF in fatbin entry {i} ({entry.arch}), not "
                                         f"linked: {exc}") from None


def _digest_bytes(kind: str, code: bytes) -> str:
    h = hashlib.sha256(f"{kind}\0\0".encode())
    h.update(code)
    return h.hexdigest()


def check_inputs(items: Iterable["LinkInput"]) -> None:
    """check_structure for every input, naming the one that fails (before linking them)."""
    for i in items:
        try:
            check_structure(i.code, i.kind)
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {i.label or i.name}: {exc}") from None


def _from_object(obj: ObjectCode, path: Path | None, label: str, check: bool) -> dict[str, Any]:
    from ..cache import digest
    if obj.kind not in LINKABLE:
        raise InvalidOptionError(
            f"link input {label} is {obj.kind!r} (AMD code): the CUDA linkers take PTX, cubin, "
            "fatbin, LTO-IR, host objects and archives")
    if check:
        try:
            check_structure(obj.code, obj.kind)
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {label}: {exc}") from None
    # Key on what the bytes say (arch=None re-derives it): a PTX file read from disk and the
    # same PTX fresh from kjit.compile are one input.
    return dict(code=obj.code, kind=obj.kind, digest=digest(obj.with_(arch=None)), arch=obj.arch, path=path,
                symbols=dict(obj.symbols), base=obj.name, label=label,
                declarations=obj.declarations)


def _one(item: Any, index: int, check: bool) -> dict[str, Any]:
    label = f"#{index}"
    if isinstance(item, ObjectCode):
        return _from_object(item, None, f"{label} ({item.name})", check)
    if isinstance(item, (bytes, bytearray, memoryview)):
        code = bytes(item)
        try:
            if _host_object(code):
                if check:
                    check_structure(code, "hostobject")
                return dict(code=code, kind="hostobject", digest=_digest_bytes("hostobject", code),
                            base=f"input{index}", label=f"{label} (bytes)")
            found = _from_object(ObjectCode(code, name=f"input{index}"), None, label, check)
            found["label"] = f"{label} (bytes)"
            return found
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {label} (bytes): {exc}") from None
    if is_foreign_code(item):   # cuda.core's ObjectCode
        try:
            obj = from_foreign_code(item)
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {label}: {exc}") from None
        return _from_object(obj, None, f"{label} ({obj.name})", check)
    if isinstance(item, str) and not _names_a_file(item):
        try:   # PTX text (or no such file, said as the path branch says it)
            obj = from_text_or_path(item, "kjit.link")
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {label}: {exc}") from None
        return _from_object(obj, None, f"{label} (PTX text)", check)
    if isinstance(item, (str, os.PathLike)):
        path = Path(item)
        if not path.exists():
            raise InvalidOptionError(f"link input {label}: no such file: {path}")
        try:   # a regular file of at most fileio.MAX_BINARY_BYTES: never a device or FIFO
            code = read_input(path, MAX_BINARY_BYTES, "link input")
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {label}: {exc}") from None
        try:
            if _host_object(code):
                if check:
                    check_structure(code, "hostobject")
                return dict(code=code, kind="hostobject", digest=_digest_bytes("hostobject", code),
                            path=path, base=path.name, label=str(path))
            obj = ObjectCode.from_file(path)
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"link input {path}: {exc}") from None
        found = _from_object(obj, path, str(path), check)
        found["base"] = str(path)
        return found
    raise InvalidOptionError(
        f"link input {label} is a {type(item).__name__}: pass kjit.ObjectCode, a cuda.core "
        "ObjectCode, bytes, PTX text or a file path (str or pathlib.Path)")


def _names_a_file(text: str) -> bool:
    try:
        return "\n" not in text and os.path.isfile(text)
    except (OSError, ValueError):   # a NUL, or too long to be a path
        return False


def _display_name(base: str, kind: str) -> str:
    """kernel.cu compiled to PTX reads as kernel.ptx in the linker's messages."""
    if base in ("", "<source>"):
        base = "input"
    p = Path(base)
    if "/" in base or os.sep in base or p.suffix == _SUFFIX[kind]:
        return base
    return p.stem + _SUFFIX[kind] if p.suffix in (".cu", ".hip", ".cpp", ".cuh") else base + _SUFFIX[kind]


def normalize(inputs: Iterable[InputLike], *, check: bool = True) -> list[LinkInput]:
    """LinkInputs with unique names; InvalidOptionError names the input that is wrong.
    check=False leaves the structure check (check_structure) to check_inputs: link() runs
    it only when it links, not on a cache hit."""
    if isinstance(inputs, (str, bytes, os.PathLike, ObjectCode)):
        inputs = [inputs]
    raw = [_one(item, i, check) for i, item in enumerate(inputs)]
    if not raw:
        raise InvalidOptionError("nothing to link: give at least one input")
    names = [_display_name(r.pop("base"), r["kind"]) for r in raw]
    out = []
    for i, (r, name) in enumerate(zip(raw, names)):
        if names.count(name) > 1:
            name = f"{name}#{i}"
        out.append(LinkInput(name=name, **r))
    return out
