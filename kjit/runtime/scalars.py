"""Number parameters: Python and numpy integers, floats and bools checked against the C type
they become (range, exactness, overflow) before a launch."""
from __future__ import annotations

import math
import struct
from typing import Any

from ..errors import ArgumentError
from . import dtypes
from .dtypes import is_numpy
from .memory import DeviceArray, array_interface
from .slots import SCALAR_FORMATS, ParamSlot


def integer(slot: ParamSlot, value: Any) -> Any:
    c = slot.ctype
    if c.kind == "bool":
        if isinstance(value, bool) or is_numpy(value, "bool_") or \
                ((isinstance(value, int) or is_numpy(value, "integer")) and value in (0, 1)):
            return bool(value)
        raise ArgumentError(f"{slot.describe()}: expected a bool, got {value!r}")
    if is_numpy(value, "bool_", "integer"):
        value = int(value)
    if not isinstance(value, int):
        kind = "a float" if isinstance(value, float) or is_numpy(value, "floating") else type(value).__name__
        hint = " (kernels take no pointers here: this parameter is an integer)" \
            if isinstance(value, DeviceArray) or array_interface(value) is not None or \
            hasattr(value, "data_ptr") else ""
        raise ArgumentError(f"{slot.describe()}: expected an integer, got {kind} {value!r}{hint}")
    lo, hi = dtypes.integer_range(c.kind, c.size)
    if not lo <= value <= hi:
        raise ArgumentError(f"{slot.describe()}: {value} does not fit in {c.name} (range {lo}..{hi})")
    return value


def floating(slot: ParamSlot, value: Any) -> Any:
    c = slot.ctype
    if isinstance(value, bool) or is_numpy(value, "bool_") or \
            not (isinstance(value, (int, float)) or is_numpy(value, "integer", "floating")):
        raise ArgumentError(f"{slot.describe()}: expected a number, got {type(value).__name__} {value!r}")
    if isinstance(value, int) or is_numpy(value, "integer"):
        as_float = narrow(int(value), c.size)
        if as_float is None:
            raise ArgumentError(f"{slot.describe()}: {int(value)} overflows {c.name}")
        if int(as_float) != int(value):
            raise ArgumentError(
                f"{slot.describe()}: the integer {int(value)} cannot be represented exactly as "
                f"{c.name}; pass a float if rounding is intended")
        return as_float
    value = float(value)
    if math.isfinite(value) and narrow(value, c.size) is None:
        raise ArgumentError(f"{slot.describe()}: {value!r} overflows {c.name}")
    return value


def narrow(value: int | float, size: int) -> float | None:
    """value rounded to the C float type of `size` bytes, as the device will see it (None
    where it overflows): struct rounds to nearest, like the compiler's conversion."""
    fmt = SCALAR_FORMATS[("float", size)]
    try:
        narrowed = struct.unpack(fmt, struct.pack(fmt, float(value)))[0]
    except OverflowError:   # beyond float (a huge int) or beyond the narrower type
        return None
    return narrowed if math.isfinite(narrowed) else None


def complex_number(slot: ParamSlot, value: Any) -> bytes:
    """A complex parameter (cuComplex, cuDoubleComplex, complex<T>...): its real and imaginary
    parts as two floats of half its size, from a Python complex or a numpy complex scalar."""
    c = slot.ctype
    if is_numpy(value, "ndarray") and value.ndim == 0 and value.dtype.kind == "c":
        value = value[()]
    if not (isinstance(value, complex) or is_numpy(value, "complexfloating")):
        if isinstance(value, (int, float)) or is_numpy(value, "integer", "floating", "bool_"):
            hint = f"; pass complex({value!r}) for a real value"
        else:
            hint = ""
        raise ArgumentError(f"{slot.describe()}: expected a complex number (a Python complex, "
                            f"numpy.complex64 or numpy.complex128), got {type(value).__name__} "
                            f"{value!r}{hint}")
    part = c.size // 2
    parts = []
    for x in (float(value.real), float(value.imag)):
        if math.isfinite(x) and narrow(x, part) is None:
            raise ArgumentError(f"{slot.describe()}: {complex(value)!r} overflows {c.name}")
        parts.append(x)
    return struct.pack("<2f" if part == 4 else "<2d", *parts)
