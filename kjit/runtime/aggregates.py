"""Parameters passed as bytes: structs and vectors (float4...) laid out with device alignment
from tuples, dicts, numpy records or ctypes Structures, and parameters of unknown type, which
accept only values whose bytes are unambiguous."""
from __future__ import annotations

import ctypes
import struct
from typing import Any

from ..errors import ArgumentError
from . import dtypes
from .cdecl import struct_dtype
from .dtypes import is_numpy
from .pointers import address_of
from .slots import ParamSlot


def aggregate(slot: ParamSlot, value: Any) -> bytes:
    """Vectors (float4...) and structs, laid out with device alignment."""
    c = slot.ctype
    if isinstance(value, (bytes, bytearray, memoryview)):
        return exact_bytes(slot, bytes(value))
    np = dtypes.numpy()   # structs and vectors are laid out through a numpy structured dtype
    out = np.zeros((), dtype=struct_dtype(c))
    flat = [f[0] for f in c.fields]
    try:
        if isinstance(value, np.ndarray) and value.dtype.names and value.ndim:
            if value.size != 1:
                raise ArgumentError(f"{slot.describe()}: takes one record, got an array of "
                                    f"{value.size}; pass arr[i]")
            value = value.reshape(())
        if isinstance(value, dict):
            _assign(out, value, slot)
        elif isinstance(value, ctypes.Structure):
            _assign(out, {n: _ctypes_value(getattr(value, n)) for n, *_ in value._fields_}, slot)
        elif isinstance(value, (np.void, np.ndarray)) and value.dtype.names:
            return _record(out, value, slot)
        elif c.kind == "vector" and isinstance(value, (tuple, list, np.ndarray)):
            lanes = np.asarray(value).ravel()
            if lanes.size != c.count:
                raise ArgumentError(f"{slot.describe()}: expected {c.count} components, got {lanes.size}")
            for name, lane in zip(flat, lanes):
                _store(out, name, lane, slot)
        elif c.kind == "struct" and isinstance(value, (tuple, list)):
            if len(value) != len(flat):
                raise ArgumentError(f"{slot.describe()}: expected {len(flat)} fields ({', '.join(flat)}), got {len(value)}")
            _assign(out, dict(zip(flat, value)), slot)
        else:
            raise ArgumentError(
                f"{slot.describe()}: expected a tuple, dict, numpy structured value, ctypes "
                f"Structure or {c.size} raw bytes, got {type(value).__name__}")
    except ArgumentError:   # already names the parameter (it is a TypeError too)
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise ArgumentError(f"{slot.describe()}: {exc}") from None
    return out.tobytes()


def _record(out: Any, value: Any, slot: ParamSlot) -> bytes:
    """A numpy record for a struct or vector: by field names where they are the struct's (the
    values converted to its layout), else by layout, where its fields lie at the struct's
    offsets with the same sizes and kinds of number (its bytes taken as they are)."""
    if set(value.dtype.names) == set(out.dtype.names):
        _assign(out, {n: value[n] for n in value.dtype.names}, slot)
        return out.tobytes()
    leaves = _leaves(out.dtype)
    if _leaves(value.dtype) == leaves and value.dtype.itemsize <= out.dtype.itemsize:
        raw, buf = value.tobytes(), bytearray(out.dtype.itemsize)
        for offset, _kind, size in leaves:
            buf[offset:offset + size] = raw[offset:offset + size]
        return bytes(buf)
    raise ArgumentError(
        f"{slot.describe()}: the record's fields ({_describe(value.dtype)}) match the device "
        f"struct ({_describe(out.dtype)}) neither by name nor by layout; name its fields as the "
        f"struct does, or make a dtype with the same offsets (numpy.dtype(..., align=True))")


_NUMBER_KIND = {"i": "integer", "u": "integer", "b": "integer", "f": "float"}


def _leaves(dt: Any, base: int = 0) -> list[tuple[int, str, int]]:
    """Where each number of a dtype lies: (offset, kind of number, size), by offset; sub-arrays
    and nested records flattened, a complex number as its two parts."""
    if dt.names:
        out = []
        for n in dt.names:
            fdt, off = dt.fields[n][:2]
            out += _leaves(fdt, base + off)
        return sorted(out)
    if dt.subdtype is not None:
        elem, shape = dt.subdtype
        count = 1
        for d in shape:
            count *= d
        return [leaf for i in range(count) for leaf in _leaves(elem, base + i * elem.itemsize)]
    if dt.kind == "c" and dt.byteorder != ">":
        half = dt.itemsize // 2
        return [(base, "float", half), (base + half, "float", half)]
    kind = _NUMBER_KIND.get(dt.kind, dt.str) if dt.byteorder != ">" else dt.str
    return [(base, kind, dt.itemsize)]


def _describe(dt: Any) -> str:
    return ", ".join(f"{n} {dt.fields[n][0]} at {dt.fields[n][1]}" for n in dt.names)


def _ctypes_value(v: Any) -> Any:
    if isinstance(v, ctypes.Structure):
        return {n: _ctypes_value(getattr(v, n)) for n, *_ in v._fields_}
    if isinstance(v, ctypes.Array):
        return [_ctypes_value(x) for x in v]
    return v


def _assign(out: Any, values: dict, slot: ParamSlot) -> None:
    names = out.dtype.names
    unknown = set(values) - set(names)
    missing = set(names) - set(values)
    if unknown or missing:
        raise ArgumentError(
            f"{slot.describe()}: fields do not match the device struct ({', '.join(names)}): "
            + (f"unknown {sorted(unknown)} " if unknown else "") + (f"missing {sorted(missing)}" if missing else ""))
    for name in names:
        _store(out, name, values[name], slot)


def _store(out: Any, name: str, value: Any, slot: ParamSlot) -> None:
    """Write one field, recursing into nested structs and vectors with the same checks as
    top-level parameters: exact lane counts, no float into an int, no overflow."""
    np = dtypes.numpy()
    field_dt = out.dtype.fields[name][0]
    if field_dt.subdtype is not None:   # `int c[2]`: a sequence of its elements
        elem, shape = field_dt.subdtype
        items = list(value) if isinstance(value, (tuple, list)) or \
            (isinstance(value, np.ndarray) and value.dtype.names) else \
            list(np.asarray(value).reshape(-1)) if not elem.names else None
        count = int(np.prod(shape))
        if items is None or len(items) != count:
            got = "a " + type(value).__name__ if items is None else f"{len(items)}"
            raise ArgumentError(f"{slot.describe()}: field {name} has {count} elements, got {got}")
        view = out[name].reshape(-1)
        for i, item in enumerate(items):
            cell = np.zeros((), dtype=np.dtype([("v", elem)]))
            _store(cell, "v", item, slot)
            view[i] = cell["v"]
        return
    if field_dt.names:
        sub = out[name]
        if isinstance(value, dict) or (isinstance(value, (np.void, np.ndarray)) and value.dtype.names):
            values = value if isinstance(value, dict) else {k: value[k] for k in value.dtype.names}
            unknown, missing = set(values) - set(field_dt.names), set(field_dt.names) - set(values)
            if unknown or missing:
                raise ArgumentError(
                    f"{slot.describe()}: field {name} has fields {', '.join(field_dt.names)}; "
                    + (f"unknown {sorted(unknown)} " if unknown else "")
                    + (f"missing {sorted(missing)}" if missing else ""))
        else:
            lanes = list(np.asarray(value).ravel())
            if len(lanes) != len(field_dt.names):
                raise ArgumentError(f"{slot.describe()}: field {name} has {len(field_dt.names)} "
                                    f"components, got {len(lanes)}")
            values = dict(zip(field_dt.names, lanes))
        for k in field_dt.names:
            _store(sub, k, values[k], slot)
        return
    if isinstance(value, np.ndarray) and value.size == 1 and not value.dtype.names:
        value = value.reshape(-1)[0]   # a record array's field: one element
    if field_dt.kind in "iu":
        if isinstance(value, (float, complex, np.floating, np.complexfloating)):
            raise ArgumentError(f"{slot.describe()}: field {name} is an integer, got {value!r}")
        info = np.iinfo(field_dt)
        if not info.min <= int(value) <= info.max:
            raise ArgumentError(f"{slot.describe()}: field {name}={value} does not fit {field_dt}")
    elif field_dt.kind == "f":
        if isinstance(value, (complex, np.complexfloating)):
            raise ArgumentError(f"{slot.describe()}: field {name} is real, got {value!r}")
        with np.errstate(over="ignore"):
            narrowed = field_dt.type(value)
        if np.isfinite(float(value)) and not np.isfinite(narrowed):
            raise ArgumentError(f"{slot.describe()}: field {name}={value!r} overflows {field_dt}")
    elif field_dt.kind == "c":
        if not isinstance(value, (int, float, complex, np.number)) or isinstance(value, bool):
            raise ArgumentError(f"{slot.describe()}: field {name} is complex, got {value!r}")
        with np.errstate(over="ignore"):
            narrowed = field_dt.type(value)
        if np.isfinite(complex(value)) and not np.isfinite(narrowed):
            raise ArgumentError(f"{slot.describe()}: field {name}={value!r} overflows {field_dt}")
    out[name] = value


def exact_bytes(slot: ParamSlot, data: bytes) -> bytes:
    if len(data) != slot.size:
        raise ArgumentError(f"{slot.describe()}: got {len(data)} bytes, the parameter has {slot.size}")
    return data


def raw_bytes(slot: ParamSlot, value: Any) -> bytes:
    """Parameters of unknown type accept only values whose bytes are unambiguous."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return exact_bytes(slot, bytes(value))
    if is_numpy(value, "generic") or (is_numpy(value, "ndarray") and not value.ndim):
        return exact_bytes(slot, value.tobytes())
    if is_numpy(value, "ndarray") and value.dtype.names and value.size == 1:
        return exact_bytes(slot, value.tobytes())   # a one-element record array: its record
    if isinstance(value, ctypes.Structure) or isinstance(value, ctypes._SimpleCData):
        return exact_bytes(slot, bytes(value))
    address = address_of(value) if slot.size == 8 else None
    if address is not None:
        return struct.pack("<Q", address)
    raise ArgumentError(
        f"{slot.describe()}: kjit does not know this parameter's C type, so a Python "
        f"{type(value).__name__} is ambiguous; pass a numpy scalar of the exact type "
        "(np.int32(n), np.float32(x)...), raw bytes, a ctypes value, or a device array/kjit.ptr "
        "for a pointer")
