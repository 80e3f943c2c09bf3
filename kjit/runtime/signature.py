"""Each kernel parameter's C type, from whatever the code can tell, shared by the CUDA and
HIP loaders: the source's `extern "C"` signature (the digest compile() keeps), the mangled
name of template and C++-linkage kernels, or PTX `.entry` widths for code without source."""
from __future__ import annotations

from typing import Callable

from ..errors import KjitError
from ..objectcode import ObjectCode
from . import cdecl, mangled
from .slots import ParamSlot, layout


def resolve_slots(obj: ObjectCode, name: str, symbol: str,
                  driver_info: list[tuple[int, int]] | None,
                  ptx_text: Callable[[], bytes | None] = lambda: None) -> list[ParamSlot]:
    """Parameter slots: offsets and sizes from the runtime (cuFuncGetParamInfo / comgr)
    when it can tell, types from the code. Disagreement falls back to unknown types, which
    accept only values whose bytes are unambiguous."""
    decls = obj.metadata.get("declarations") or ""
    structs = cdecl.parse_structs(decls) if decls else {}
    ctypes_, names = None, None
    if symbol.startswith("_Z"):
        types = mangled.parameter_types(symbol)
        if types is not None:
            ctypes_ = [cdecl.parse_type(t, structs) for t in types]
            names = [f"arg{i}" for i in range(len(types))]
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
