"""Pack cubins, PTX and LTO-IR for several architectures into one fatbin with nvFatbin.

The driver picks the entry that fits the device when the fatbin is loaded: the cubin for
its SM, else PTX it can JIT. Output is deterministic: entries are added in a canonical
order (cubins by arch, then PTX, then LTO-IR), so the same inputs give the same bytes
whatever order they were handed over in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from .. import arch as arch_mod
from ..errors import InvalidOptionError, KjitError
from ..objectcode import ObjectCode, merge_declarations

# nvFatbin's -compress-mode values. kjit's default is "none": every entry then stays
# readable by kjit itself (inspect, PTX version checks in the loader) with no zstd
# library; "balance" is nvcc's default (PTX compressed), "size" compresses everything.
COMPRESS_MODES = ("none", "speed", "balance", "size")
_KIND_ORDER = {"cubin": 0, "ptx": 1, "ltoir": 2}


class FatbinError(KjitError):
    """nvFatbin rejected an input or could not produce the fatbin."""


@dataclass(frozen=True)
class FatbinInput:
    """One entry to pack: kind (cubin, ptx, ltoir), arch (sm_90, sm_90a, compute_90), bytes."""

    kind: str
    arch: str
    code: bytes
    name: str = "kjit"
    options: str = ""   # JIT options stored with PTX / LTO-IR

    def sort_key(self) -> tuple:
        a = arch_mod.parse(self.arch)
        return (_KIND_ORDER[self.kind], a.number, a.suffix, self.name, self.code)


def _as_input(item: ObjectCode | FatbinInput) -> FatbinInput:
    if isinstance(item, FatbinInput):
        inp = item
    elif isinstance(item, ObjectCode):
        kind = "cubin" if item.kind == "object" else item.kind
        if item.arch is None:
            raise InvalidOptionError(f"{item.name}: {item.kind} has no architecture recorded; "
                                     "pass a FatbinInput with arch=")
        inp = FatbinInput(kind, item.arch, item.code, item.name)
    else:
        raise InvalidOptionError(f"fatbin inputs are ObjectCode or FatbinInput, got {type(item).__name__}")
    if inp.kind not in _KIND_ORDER:
        raise InvalidOptionError(
            f"{inp.name}: a fatbin holds cubin, ptx or ltoir entries, not {inp.kind!r} "
            "(HIP code objects go into an offload bundle: kjit build --backend hip)")
    a = arch_mod.parse(inp.arch)
    if inp.kind == "ptx" and not a.virtual:
        inp = FatbinInput(inp.kind, a.compute, inp.code, inp.name, inp.options)
    return inp


def _arch_arg(arch: str) -> str:
    """nvFatbin wants the XX of sm_XX / compute_XX, with the a/f suffix: '90', '90a', '100f'."""
    a = arch_mod.parse(arch)
    return f"{a.number}{a.suffix}"


def build(items: Iterable[ObjectCode | FatbinInput], *, compress: str = "none") -> bytes:
    """The fatbin bytes holding every item. Raises FatbinError naming the entry nvFatbin
    rejected, InvalidOptionError for inputs that cannot go into a fatbin."""
    from ..families import load_family_library
    load_family_library("nvfatbin")
    from cuda.bindings import nvfatbin

    if compress not in COMPRESS_MODES:
        raise InvalidOptionError(f"compress={compress!r} is not one of {', '.join(COMPRESS_MODES)}")
    inputs = sorted((_as_input(i) for i in items), key=FatbinInput.sort_key)
    if not inputs:
        raise InvalidOptionError("a fatbin needs at least one cubin, PTX or LTO-IR entry")
    seen: dict[tuple[str, str], str] = {}
    for inp in inputs:
        if (inp.kind, inp.arch) in seen and seen[(inp.kind, inp.arch)] != inp.name:
            raise InvalidOptionError(
                f"two {inp.kind} entries for {inp.arch} ({seen[(inp.kind, inp.arch)]} and "
                f"{inp.name}): the driver would load only one; link them into one first")
        seen[(inp.kind, inp.arch)] = inp.name
    options = ["-64", f"-compress-mode={compress}"]
    if compress == "none":
        options.append("-compress=false")
    try:
        handle = nvfatbin.create(options, len(options))
    except nvfatbin.nvFatbinError as exc:
        raise FatbinError(f"nvFatbinCreate({' '.join(options)}) failed: {exc}") from None
    except Exception as exc:   # libnvfatbin not found (cuda.pathfinder's error, an OSError)
        from ..families import family_install_hint
        raise FatbinError(f"nvFatbin is not installed: {family_install_hint()} "
                          f"[{type(exc).__name__}: {str(exc).strip()}]") from None
    try:
        for inp in inputs:
            what = f"{inp.kind} for {inp.arch} ({inp.name}, {len(inp.code)} bytes)"
            try:
                if inp.kind == "cubin":
                    nvfatbin.add_cubin(handle, inp.code, len(inp.code), _arch_arg(inp.arch), inp.name)
                elif inp.kind == "ptx":
                    nvfatbin.add_ptx(handle, inp.code, len(inp.code), _arch_arg(inp.arch),
                                     inp.name, inp.options)
                else:
                    nvfatbin.add_ltoir(handle, inp.code, len(inp.code), _arch_arg(inp.arch),
                                       inp.name, inp.options)
            except nvfatbin.nvFatbinError as exc:
                raise FatbinError(f"nvFatbin rejected the {what}: {exc}") from None
        size = nvfatbin.size(handle)
        buf = bytearray(size)
        nvfatbin.get(handle, buf)
    except nvfatbin.nvFatbinError as exc:
        raise FatbinError(f"nvFatbin could not finish the fatbin: {exc}") from None
    finally:
        nvfatbin.destroy(handle)
    return bytes(buf)


def make_fatbin(objects: Iterable[ObjectCode | FatbinInput], *, compress: str = "none",
                name: str = "kjit.fatbin", symbols: Mapping[str, str] | None = None) -> ObjectCode:
    """An ObjectCode of kind "fatbin" holding the objects; name-expression symbols of the
    inputs are merged (they must agree: lowered names do not depend on the arch), and so are
    their declarations (the parameter types kjit.load reads)."""
    objects = list(objects)
    merged: dict[str, str] = dict(symbols or {})
    for obj in objects:
        for expr, lowered in (obj.symbols.items() if isinstance(obj, ObjectCode) else ()):
            if merged.setdefault(expr, lowered) != lowered:
                raise InvalidOptionError(
                    f"name expression {expr!r} lowers to {merged[expr]!r} in one input and "
                    f"{lowered!r} in another")
    code = build(objects, compress=compress)
    declarations = merge_declarations(obj.declarations for obj in objects
                                      if isinstance(obj, ObjectCode))
    return ObjectCode(code, kind="fatbin", symbols=merged, name=name,
                      metadata={"compress": compress,
                                **({"declarations": declarations} if declarations else {})})
