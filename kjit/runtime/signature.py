"""Each kernel parameter's C type, from whatever the code can tell, shared by the CUDA and
HIP loaders: the source's `extern "C"` signature (the digest compile() keeps), the mangled
name of template and C++-linkage kernels, or PTX `.entry` widths for code without source."""
from __future__ import annotations

import re
from typing import Callable

from ..errors import KjitError
from ..objectcode import ObjectCode
from . import cdecl, mangled
from .slots import ParamSlot, layout


def _with_source_types(symbol: str, decls: str, ctypes_: list, names: list) -> tuple[list, list]:
    """A C++-linkage kernel that is no template (`_Z1kP6float2`): its names, and the types its
    source spells where a mangled name loses them (cuComplex is float2 there), from the
    source's declaration, if it has one of that name and the same parameter sizes."""
    m = re.match(r"_Z(\d+)", symbol)
    if m is None or not decls:
        return ctypes_, names
    end = m.end() + int(m.group(1))
    if symbol[end:end + 1] == "I":   # a template's arguments follow its name
        return ctypes_, names
    sig = cdecl.parse_signatures(decls).get(symbol[m.end():end])
    if sig is None or len(sig.params) != len(ctypes_) or not all(
            _same(p.ctype, c) for p, c in zip(sig.params, ctypes_)):
        return ctypes_, names   # another overload, or a declaration kjit reads otherwise
    return [p.ctype or c for p, c in zip(sig.params, ctypes_)], [p.name for p in sig.params]


# what a mangled name says for a complex type: cuComplex.h's are typedefs of float2 / double2
_AS_MANGLED = {"<c8": "<f4", "<c16": "<f8"}


def _same(source: cdecl.CType | None, mangled: cdecl.CType | None) -> bool:
    """Whether the source's type is the one the mangled name encodes, as far as it tells."""
    if source is None or mangled is None:
        return source is None or mangled is None and source.kind != "pointer"
    if source.size != mangled.size or (source.kind == "pointer") != (mangled.kind == "pointer"):
        return False
    return source.typestr == mangled.typestr or (
        _AS_MANGLED.get(source.typestr or "") == mangled.typestr and
        (source.kind == "pointer" or mangled.kind == "vector"))


def resolve_slots(obj: ObjectCode, name: str, symbol: str,
                  driver_info: list[tuple[int, int]] | None,
                  ptx_text: Callable[[], bytes | None] = lambda: None) -> list[ParamSlot]:
    """Parameter slots: offsets and sizes from the runtime (cuFuncGetParamInfo / comgr)
    when it can tell, types from the code. Disagreement falls back to unknown types, which
    accept only values whose bytes are unambiguous."""
    decls = obj.metadata.get("declarations") or ""
    named = cdecl.aliases_of(decls) if decls else {}
    structs = cdecl.parse_structs(decls, named) if decls else {}
    ctypes_, names = None, None
    if symbol.startswith("_Z"):
        types = mangled.parameter_types(symbol)
        if types is not None:
            ctypes_ = [cdecl.parse_type(t, structs, named) for t in types]
            names = [f"arg{i}" for i in range(len(types))]
            ctypes_, names = _with_source_types(symbol, decls, ctypes_, names)
    elif decls:
        sig = cdecl.parse_signatures(decls).get(symbol)
        if sig is not None:
            ctypes_ = [p.ctype for p in sig.params]
            names = [p.name for p in sig.params]
    if ctypes_ is None:
        ptx = ptx_text()
        if ptx is not None:
            ctypes_ = cdecl.ptx_param_types(ptx, symbol)
            names = [f"arg{i}" for i in range(len(ctypes_ or ()))]
    if driver_info is not None:
        if ctypes_ is None or len(ctypes_) != len(driver_info) or any(
                c is not None and c.size != size for c, (_, size) in zip(ctypes_, driver_info)):
            ctypes_ = [None] * len(driver_info)
            names = names if names and len(names) == len(driver_info) else \
                [f"arg{i}" for i in range(len(driver_info))]
    elif ctypes_ is None or any(c is None for c in ctypes_):
        raise KjitError(
            f"kjit cannot tell the parameter types of kernel {name!r}: compile it with kjit "
            "from source (extern \"C\" or a name expression), or use a runtime that reports "
            "parameter layouts (CUDA 12.4+ cuFuncGetParamInfo)")
    return layout(ctypes_, names, driver_info)
