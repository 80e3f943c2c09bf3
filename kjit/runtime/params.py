"""Kernel arguments: checked conversion of Python values to each parameter's C type, and the
packed parameter buffer the driver reads.

The layout (offset and size of each parameter) comes from the driver (cuFuncGetParamInfo)
when it can tell, else from the device alignment rules; the C type comes from the source's
`extern "C"` signature or the mangled name. Every conversion happens before a launch: a wrong
value is an ArgumentError naming the parameter, never a silently wrong kernel input.
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Callable, NamedTuple

from ..errors import ArgumentError
from . import dtypes
from .cdecl import CType, struct_dtype
from .dtypes import is_numpy
from .memory import DeviceArray, _c_strides, _HostTransfer, launch_key


class ptr:
    """A raw device pointer passed to a pointer parameter: `kjit.ptr(0x7f...)`."""

    __slots__ = ("value",)

    def __init__(self, value: int):
        if isinstance(value, bool) or not (isinstance(value, int) or is_numpy(value, "integer")) \
                or value < 0:
            raise ArgumentError(f"kjit.ptr takes a non-negative int address, got {value!r}")
        self.value = int(value)

    def __repr__(self) -> str:
        return f"kjit.ptr({self.value:#x})"


class ParamSlot(NamedTuple):
    """One parameter: where it lives in the buffer and what it accepts."""

    index: int
    name: str
    offset: int
    size: int
    ctype: CType | None

    def describe(self) -> str:
        t = self.ctype.name if self.ctype else f"<{self.size}-byte value of unknown type>"
        return f"parameter {self.index} '{self.name}' ({t})"


_SCALAR_FMT = {("word64", 8): "Q", ("int", 1): "b", ("int", 2): "h", ("int", 4): "i", ("int", 8): "q",
               ("uint", 1): "B", ("uint", 2): "H", ("uint", 4): "I", ("uint", 8): "Q",
               ("float", 2): "e", ("float", 4): "f", ("float", 8): "d", ("bool", 1): "?"}


def slot_format(slot: ParamSlot) -> str:
    c = slot.ctype
    if c is not None and c.kind == "pointer":
        return "Q"
    if c is not None and (c.kind, c.size) in _SCALAR_FMT:
        return _SCALAR_FMT[(c.kind, c.size)]
    return f"{slot.size}s"


def layout(ctypes_: list[CType | None], names: list[str],
           driver_info: list[tuple[int, int]] | None) -> list[ParamSlot]:
    """Place parameters: the driver's (offset, size) when known, else device alignment rules."""
    slots, offset = [], 0
    for i, (c, n) in enumerate(zip(ctypes_, names)):
        if driver_info is not None:
            off, size = driver_info[i]
            if c is not None and c.size != size:
                raise ArgumentError(
                    f"parameter {i} '{n}': kjit reads its type as {c.name} ({c.size} bytes) but "
                    f"the driver says it is {size} bytes; pass the argument as raw bytes or report "
                    "this signature")
        else:
            if c is None:
                raise ArgumentError(f"parameter {i} '{n}' has a type kjit cannot lay out")
            off = -(-offset // c.align) * c.align
            size = c.size
        slots.append(ParamSlot(i, n, off, size, c))
        offset = off + size
    return slots


# --- conversions (the careful path; the generated fast path handles the common cases inline)

def convert(slot: ParamSlot, value: Any, device: int, pending: list) -> Any:
    """The packable value for one argument, or ArgumentError saying what is wrong."""
    c = slot.ctype
    if c is None:
        return _raw_bytes(slot, value)
    if c.kind == "pointer":
        return _pointer(slot, value, device, pending)
    if c.kind == "word64":  # from PTX: a pointer or a 64-bit integer
        if is_numpy(value, "integer"):
            return int(value) & 0xFFFFFFFFFFFFFFFF
        return _pointer(slot, value, device, pending)
    if c.kind in ("int", "uint", "bool"):
        return _integer(slot, value)
    if c.kind == "float":
        return _floating(slot, value)
    return _aggregate(slot, value)


def _integer(slot: ParamSlot, value: Any) -> Any:
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
            if isinstance(value, DeviceArray) or hasattr(value, "__cuda_array_interface__") else ""
        raise ArgumentError(f"{slot.describe()}: expected an integer, got {kind} {value!r}{hint}")
    lo, hi = dtypes.integer_range(c.kind, c.size)
    if not lo <= value <= hi:
        raise ArgumentError(f"{slot.describe()}: {value} does not fit in {c.name} (range {lo}..{hi})")
    return value


def _floating(slot: ParamSlot, value: Any) -> Any:
    c = slot.ctype
    if isinstance(value, bool) or is_numpy(value, "bool_") or \
            not (isinstance(value, (int, float)) or is_numpy(value, "integer", "floating")):
        raise ArgumentError(f"{slot.describe()}: expected a number, got {type(value).__name__} {value!r}")
    if isinstance(value, int) or is_numpy(value, "integer"):
        as_float = _narrow(int(value), c.size)
        if as_float is None:
            raise ArgumentError(f"{slot.describe()}: {int(value)} overflows {c.name}")
        if int(as_float) != int(value):
            raise ArgumentError(
                f"{slot.describe()}: the integer {int(value)} cannot be represented exactly as "
                f"{c.name}; pass a float if rounding is intended")
        return as_float
    value = float(value)
    if math.isfinite(value) and _narrow(value, c.size) is None:
        raise ArgumentError(f"{slot.describe()}: {value!r} overflows {c.name}")
    return value


def _narrow(value: int | float, size: int) -> float | None:
    """value rounded to the C float type of `size` bytes, as the device will see it (None
    where it overflows): struct rounds to nearest, like the compiler's conversion."""
    fmt = _SCALAR_FMT[("float", size)]
    try:
        narrowed = struct.unpack(fmt, struct.pack(fmt, float(value)))[0]
    except OverflowError:   # beyond float (a huge int) or beyond the narrower type
        return None
    return narrowed if math.isfinite(narrowed) else None


def _pointer(slot: ParamSlot, value: Any, device: int, pending: list) -> int:
    if isinstance(value, ptr):
        return value.value
    if isinstance(value, DeviceArray):
        _check_array(slot, value.typestr, value.is_c_contiguous, value.device, device)
        return value.ptr
    if isinstance(value, _HostTransfer):
        _check_array(slot, value.array.dtype.str, True, device, device)
        dev = value.to_device()
        pending.append((value, dev))
        return dev.ptr
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        data, _readonly = cai["data"]
        typestr, itemsize, _ = dtypes.resolve(cai["typestr"])
        shape = tuple(cai["shape"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize) or \
            math.prod(shape) <= 1
        _check_array(slot, typestr, contiguous, _pointer_device(data), device)
        return int(data or 0)
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__") and \
            not is_numpy(value, "ndarray"):
        from .dlpack import describe
        data, typestr, itemsize, shape, strides, dev_id = describe(value)
        contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize)
        _check_array(slot, typestr, contiguous, dev_id, device)
        return data
    if is_numpy(value, "ndarray"):
        raise ArgumentError(
            f"{slot.describe()}: got a host numpy array; copy it first with kjit.to_device(x), or "
            "wrap it in kjit.In(x) / kjit.Out(x) / kjit.InOut(x) to copy around the launch")
    if (isinstance(value, int) or is_numpy(value, "integer")) and not isinstance(value, bool):
        raise ArgumentError(
            f"{slot.describe()}: got the int {int(value)}; pass raw addresses as kjit.ptr(address) "
            "so an integer is never taken for a pointer by mistake")
    raise ArgumentError(
        f"{slot.describe()}: expected a device array (kjit.DeviceArray, CuPy, PyTorch, anything "
        f"with __cuda_array_interface__ or __dlpack__) or kjit.ptr, got {type(value).__name__}")


def _check_array(slot: ParamSlot, typestr: str, contiguous: bool, arr_device: int | None,
                 device: int) -> None:
    want = slot.ctype.typestr if slot.ctype.kind == "pointer" else None  # word64: pointee unknown
    if want is not None and typestr != want:
        raise ArgumentError(
            f"{slot.describe()}: the array holds {dtypes.name(typestr)} but the kernel reads "
            f"{dtypes.name(want)}; convert it (e.g. x.astype(np.{dtypes.name(want)}))")
    if not contiguous:
        raise ArgumentError(
            f"{slot.describe()}: the array is not C-contiguous (a strided view); the kernel "
            "would read it as dense memory. Pass a contiguous copy, or kjit.ptr(address) if "
            "the kernel handles the strides itself")
    if arr_device is not None and arr_device != device:
        raise ArgumentError(
            f"{slot.describe()}: the array is on device {arr_device} but the kernel runs on "
            f"device {device}")


def _pointer_device(address: int) -> int | None:
    """The device ordinal owning a device address (None when the driver can't say)."""
    from .. import driver
    if not address:
        return None
    try:
        drv = driver.bindings()
        err, ordinal = drv.cuPointerGetAttribute(
            drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address)
    except Exception:  # no CUDA driver (e.g. the HIP runtime): the device can't be checked
        return None
    return int(ordinal) if not err else None


def _aggregate(slot: ParamSlot, value: Any) -> bytes:
    """Vectors (float4...) and structs, laid out with device alignment."""
    c = slot.ctype
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _exact_bytes(slot, bytes(value))
    np = dtypes.numpy()   # structs and vectors are laid out through a numpy structured dtype
    out = np.zeros((), dtype=struct_dtype(c))
    flat = [f[0] for f in c.fields]
    try:
        if isinstance(value, dict):
            _assign(out, value, slot)
        elif isinstance(value, ctypes.Structure):
            _assign(out, {n: _ctypes_value(getattr(value, n)) for n, *_ in value._fields_}, slot)
        elif isinstance(value, (np.void, np.ndarray)) and getattr(value, "dtype", None) is not None \
                and value.dtype.names:
            _assign(out, {n: value[n] for n in value.dtype.names}, slot)
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
    except (TypeError, ValueError, OverflowError) as exc:
        raise ArgumentError(f"{slot.describe()}: {exc}") from None
    return out.tobytes()


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
    if field_dt.kind in "iu":
        if isinstance(value, (float, np.floating)):
            raise ArgumentError(f"{slot.describe()}: field {name} is an integer, got {value!r}")
        info = np.iinfo(field_dt)
        if not info.min <= int(value) <= info.max:
            raise ArgumentError(f"{slot.describe()}: field {name}={value} does not fit {field_dt}")
    elif field_dt.kind == "f":
        with np.errstate(over="ignore"):
            narrowed = field_dt.type(value)
        if np.isfinite(float(value)) and not np.isfinite(narrowed):
            raise ArgumentError(f"{slot.describe()}: field {name}={value!r} overflows {field_dt}")
    out[name] = value


def _exact_bytes(slot: ParamSlot, data: bytes) -> bytes:
    if len(data) != slot.size:
        raise ArgumentError(f"{slot.describe()}: got {len(data)} bytes, the parameter has {slot.size}")
    return data


def _raw_bytes(slot: ParamSlot, value: Any) -> bytes:
    """Parameters of unknown type accept only values whose bytes are unambiguous."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _exact_bytes(slot, bytes(value))
    if is_numpy(value, "generic") or (is_numpy(value, "ndarray") and not value.ndim):
        return _exact_bytes(slot, value.tobytes())
    if isinstance(value, ctypes.Structure) or isinstance(value, ctypes._SimpleCData):
        return _exact_bytes(slot, bytes(value))
    if slot.size == 8 and (isinstance(value, (ptr, DeviceArray)) or
                           hasattr(value, "__cuda_array_interface__")):
        if isinstance(value, ptr):
            return struct.pack("<Q", value.value)
        if isinstance(value, DeviceArray):
            return struct.pack("<Q", value.ptr)
        return struct.pack("<Q", int(value.__cuda_array_interface__["data"][0] or 0))
    raise ArgumentError(
        f"{slot.describe()}: kjit does not know this parameter's C type, so a Python "
        f"{type(value).__name__} is ambiguous; pass a numpy scalar of the exact type "
        "(np.int32(n), np.float32(x)...), raw bytes, a ctypes value, or a device array/kjit.ptr "
        "for a pointer")


# --- the packer ---------------------------------------------------------------------

class Packer:
    """Builds, once per kernel, the buffer, the void** array into it, and a fill function that
    converts and writes all arguments with one struct.pack_into call."""

    def __init__(self, kernel_name: str, slots: list[ParamSlot], device: int):
        self.kernel_name = kernel_name
        self.slots = slots
        self.device = device
        parts, pos = ["<"], 0
        for s in slots:
            if s.offset < pos:
                raise ArgumentError(f"kernel {kernel_name}: overlapping parameters at {s.offset}")
            if s.offset > pos:
                parts.append(f"{s.offset - pos}x")
            parts.append(slot_format(s))
            pos = s.offset + s.size
        self.size = pos
        self.format = "".join(parts)
        self.struct = struct.Struct(self.format)
        assert self.struct.size == self.size, (self.format, self.size)

    def new_buffers(self) -> tuple[Any, Any, int]:
        """(argument buffer, void** array of parameter addresses, address of that array)."""
        buf = ctypes.create_string_buffer(max(self.size, 1))
        base = ctypes.addressof(buf)
        arr = (ctypes.c_void_p * max(len(self.slots), 1))(*[base + s.offset for s in self.slots])
        return buf, arr, ctypes.addressof(arr)

    # kinds of the C packer (kjit/runtime/_launch.c): 0 means "only Python can convert this"
    _C_KINDS = {("int", 1): 1, ("uint", 1): 2, ("int", 2): 3, ("uint", 2): 4, ("int", 4): 5,
                ("uint", 4): 6, ("int", 8): 7, ("uint", 8): 8, ("float", 4): 10, ("float", 8): 11}

    def c_spec(self) -> tuple[bytes, tuple] | None:
        """(spec, tokens) for the C packer, or None when a parameter needs Python (structs,
        vectors, bools, halves, pointers of unknown type): then the generated Python
        launcher, which converts only those arguments the slow way, is faster."""
        spec, tokens = [], []
        for s in self.slots:
            c = s.ctype
            if c is None:
                return None
            if c.kind == "pointer" and c.typestr is not None:
                kind, token = 20, launch_key(c.typestr, self.device)
            else:
                kind, token = self._C_KINDS.get((c.kind, c.size), 0), None
            if kind == 0:
                return None
            spec.append(struct.pack("<ii", kind, s.offset))
            tokens.append(token)
        return b"".join(spec), tuple(tokens)

    def convert_all(self, args: tuple, pending: list) -> list:
        if len(args) != len(self.slots):
            raise self.count_error(len(args))
        return [convert(s, a, self.device, pending) for s, a in zip(self.slots, args)]

    def count_error(self, got: int) -> ArgumentError:
        names = ", ".join(s.name for s in self.slots)
        return ArgumentError(f"kernel {self.kernel_name} takes {len(self.slots)} arguments "
                             f"({names}), got {got}")

    def fast_source(self) -> tuple[str, dict]:
        """Python source of `fill(buf, a0, a1, ...)`: inline checks for the common types,
        the careful converter for anything else."""
        names = {"pack_into": self.struct.pack_into, "DeviceArray": DeviceArray, "ptr": ptr,
                 "float": float, "int": int, "bool": bool, "type": type}
        lines, values = [], []
        for s in self.slots:
            a, v = f"a{s.index}", f"v{s.index}"
            c = s.ctype
            if c is not None and c.kind == "pointer" and c.typestr is not None:
                # a contiguous kjit array of the right dtype on this device: one identity test
                names[f"K{s.index}"] = launch_key(c.typestr, self.device)
                lines.append(f"    {v} = {a}.ptr if type({a}) is DeviceArray and {a}.launch_key is K{s.index} "
                             f"else CONVERT(SLOTS[{s.index}], {a}, DEVICE, pending)")
            elif c is not None and c.kind == "pointer":
                lines.append(f"    {v} = {a}.ptr if type({a}) is DeviceArray and {a}.launch_key is not None "
                             f"and {a}.device == DEVICE else CONVERT(SLOTS[{s.index}], {a}, DEVICE, pending)")
            elif c is not None and c.kind in ("int", "uint"):
                # struct itself refuses floats and out-of-range ints (struct.error), and the
                # careful path then names the parameter: ints go straight to pack_into
                values.append(a)
                continue
            elif c is not None and c.kind == "float":
                lines.append(f"    {v} = {a} if type({a}) is float else CONVERT(SLOTS[{s.index}], {a}, DEVICE, pending)")
            else:
                lines.append(f"    {v} = CONVERT(SLOTS[{s.index}], {a}, DEVICE, pending)")
            values.append(v)
        names.update(CONVERT=convert, SLOTS=self.slots, DEVICE=self.device)
        args = ", ".join(f"a{s.index}" for s in self.slots)
        body = "\n".join(lines) or "    pass"
        src = (f"def fill(buf, pending{', ' if args else ''}{args}):\n{body}\n"
               f"    pack_into(buf, 0{', ' if values else ''}{', '.join(values)})\n")
        return src, names

    def make_fill(self) -> Callable:
        src, names = self.fast_source()
        exec(compile(src, f"<kjit fill {self.kernel_name}>", "exec"), names)
        return names["fill"]

    def diagnose(self, args: tuple) -> ArgumentError:
        """After pack_into refused a value: the careful path names the parameter and why."""
        try:
            self.convert_all(args, [])
        except ArgumentError as exc:
            return exc
        return ArgumentError(f"kernel {self.kernel_name}: an argument could not be packed")
