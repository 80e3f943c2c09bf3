"""A build's results packed into the one file `kjit build` writes, as an ObjectCode: a CUDA
fatbin (bytes from formats.fatbin.write_fatbin, nvFatbin) or a HIP offload bundle
(formats.bundle.write_bundle).

The bytes are the formats' business; this module adds what an entry's code cannot carry
for the whole container: the lowered names of the name expressions (`merge_symbols`: they
must agree, since a lowered name does not depend on the arch) and the sources' declarations
(the parameter types kjit.load reads). It sits above objectcode, which formats/ may not
import, so it is the ObjectCode face of those writers.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..errors import InvalidOptionError
from ..formats import FatbinInput, write_fatbin
from ..objectcode import ObjectCode, merge_declarations


def merge_symbols(objects: Iterable[Any]) -> dict[str, str]:
    """The name-expression → lowered-name mapping of every ObjectCode in `objects` (other
    inputs carry none), checked to agree."""
    merged: dict[str, str] = {}
    for obj in objects:
        for expr, lowered in (obj.symbols.items() if isinstance(obj, ObjectCode) else ()):
            if merged.setdefault(expr, lowered) != lowered:
                raise InvalidOptionError(
                    f"name expression {expr!r} lowers to {merged[expr]!r} in one input and "
                    f"{lowered!r} in another")
    return merged


def make_fatbin(objects: Iterable[ObjectCode | FatbinInput], *, compress: str = "none",
                name: str = "kjit.fatbin", symbols: Mapping[str, str] | None = None) -> ObjectCode:
    """An ObjectCode of kind "fatbin" holding the objects, with their declarations merged.
    symbols: the lowered names it carries, where the caller has merged them already (a build
    takes them from its compiles); else `merge_symbols(objects)`."""
    objects = list(objects)
    code = write_fatbin(objects, compress=compress)
    declarations = merge_declarations(obj.declarations for obj in objects
                                      if isinstance(obj, ObjectCode))
    return ObjectCode(code, kind="fatbin",
                      symbols=dict(symbols) if symbols is not None else merge_symbols(objects),
                      name=name, metadata={"compress": compress,
                                           **({"declarations": declarations} if declarations else {})})


def make_bundle(objects: Iterable[ObjectCode], *, name: str,
                symbols: Mapping[str, str] | None = None) -> ObjectCode:
    """An ObjectCode of kind "hipfb" holding one AMD code object per gfx target, in order;
    symbols as for make_fatbin."""
    from ..formats import write_bundle
    objects = list(objects)
    code = write_bundle([(o.arch, o.code) for o in objects])
    declarations = merge_declarations(o.declarations for o in objects)
    return ObjectCode(code, kind="hipfb",
                      symbols=dict(symbols) if symbols is not None else merge_symbols(objects),
                      name=name, metadata={"declarations": declarations} if declarations else None)
