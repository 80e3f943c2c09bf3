"""Element types as numpy's typestr ('<f4', '|u1', '|b1'), so the launch path needs no numpy.

numpy costs more to import than everything else between a fresh process and its first launch
(50 ms on a warm laptop, over 200 ms where its bytecode is not cached), so kjit imports it
only when a program hands it a numpy object (numpy is then loaded already) or asks for one
back (`DeviceArray.get()`, struct arguments)."""
from __future__ import annotations

import sys
from typing import Any

# name -> (typestr, itemsize) for the dtypes a kernel reads through a typed pointer
_COMMON = {"float16": ("<f2", 2), "float32": ("<f4", 4), "float64": ("<f8", 8),
           "int8": ("|i1", 1), "int16": ("<i2", 2), "int32": ("<i4", 4), "int64": ("<i8", 8),
           "uint8": ("|u1", 1), "uint16": ("<u2", 2), "uint32": ("<u4", 4), "uint64": ("<u8", 8),
           "bool": ("|b1", 1), "complex64": ("<c8", 8), "complex128": ("<c16", 16)}
NAMES = {ts: name for name, (ts, _) in _COMMON.items()}
# Element types numpy has no dtype for, by the names PyTorch and ml_dtypes give them: kjit's
# typestr for each is its name, and an array of unsigned ints of its size may carry its bits.
EXTRA = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e8m0fnu": 1}
BITS = {name: "<u2" if size == 2 else "|u1" for name, size in EXTRA.items()}
NAMES.update({name: name for name in EXTRA})
_BY_STRING = dict(_COMMON)
for _name, (_ts, _size) in _COMMON.items():
    _BY_STRING[_ts] = _BY_STRING[_ts.lstrip("<|=")] = (_ts, _size)
    for _order in "<>=|" if _size == 1 else "<=":   # byte order means nothing for one byte
        _BY_STRING[_order + _ts[1:]] = (_ts, _size)
_BY_STRING.update({"half": _COMMON["float16"], "single": _COMMON["float32"],
                   "double": _COMMON["float64"], "float": _COMMON["float64"], "?": _COMMON["bool"],
                   "int": _COMMON["int64"], "bool_": _COMMON["bool"]})
_BY_PYTHON_TYPE = {float: _COMMON["float64"], int: _COMMON["int64"], bool: _COMMON["bool"],
                   complex: _COMMON["complex128"]}
LITTLE_ENDIAN = sys.byteorder == "little"


def numpy() -> Any:
    import numpy
    return numpy


def resolve(dtype: Any) -> tuple[str, int, Any]:
    """(typestr, itemsize, numpy dtype or None) for anything numpy.dtype() accepts; numpy is
    imported only for what the common table lacks (structured, strings, datetimes...)."""
    hit = None
    if isinstance(dtype, str):
        hit = _BY_STRING.get(dtype)
    elif isinstance(dtype, type):
        hit = _BY_PYTHON_TYPE.get(dtype)
    if hit is not None and LITTLE_ENDIAN:
        return hit[0], hit[1], None
    dt = numpy().dtype(dtype)
    return dt.str, dt.itemsize, dt


def name(typestr: str) -> str:
    """'float32' for '<f4': for messages."""
    return NAMES.get(typestr) or str(numpy().dtype(typestr))


def accepts(want: str, typestr: str) -> bool:
    """Whether an array of `typestr` may be passed where a kernel reads `want`: the same
    element type, or the bits of one numpy lacks (bfloat16 as uint16)."""
    return typestr == want or BITS.get(want) == typestr


def is_numpy(value: Any, *kinds: str) -> bool:
    """isinstance(value, numpy.<kind>...) without importing numpy: a program that never
    imported numpy cannot pass a numpy object."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, tuple(getattr(np, k) for k in kinds))


def integer_range(kind: str, size: int) -> tuple[int, int]:
    """(min, max) of a C integer type: kind "int" (signed) or "uint"."""
    bits = 8 * size
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if kind == "int" else (0, (1 << bits) - 1)
