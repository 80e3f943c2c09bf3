"""Kernel arguments: checked conversion of Python values to each parameter's C type, and the
packed parameter buffer the driver reads.

The layout (offset and size of each parameter) comes from the driver (cuFuncGetParamInfo)
when it can tell, else from the device alignment rules (`slots`); the C type comes from the
source's `extern "C"` signature or the mangled name. Every conversion happens before a launch
(`scalars`, `pointers`, `aggregates`): a wrong value is an ArgumentError naming the
parameter, never a silently wrong kernel input.
"""
from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any, Callable

from ..errors import ArgumentError
from .aggregates import aggregate, raw_bytes
from . import dtypes
from .dtypes import is_numpy
from .memory import DeviceArray, _HostTransfer, launch_key
from .pointers import pointer, ptr
from .scalars import complex_number, floating, integer
from .slots import ParamSlot, layout, slot_format

__all__ = ["ParamSlot", "Packer", "convert", "layout", "ptr", "slot_format"]

# The C packer's kinds that are not a number's (kjit/runtime/_launch.c's K_PYTHON, K_ARRAY and
# K_ARRAY_BITS; tests/test_c_constants.py checks them): a slot only Python converts, a typed
# pointer (its token: the arrays it takes), a pointer to bfloat16 or a float8 (its own
# token and its bits')
K_PYTHON, K_ARRAY, K_ARRAY_BITS = 0, 20, 21


def convert(slot: ParamSlot, value: Any, device: int, pending: list) -> Any:
    """The packable value for one argument, or ArgumentError saying what is wrong."""
    c = slot.ctype
    if c is None:
        return raw_bytes(slot, value)
    if c.kind == "pointer":
        return pointer(slot, value, device, pending)
    if c.kind == "word64":  # from PTX: a pointer or a 64-bit integer
        if is_numpy(value, "integer"):
            return int(value) & 0xFFFFFFFFFFFFFFFF
        return pointer(slot, value, device, pending)
    if c.kind in ("int", "uint", "bool"):
        return integer(slot, value)
    if c.kind == "float":
        return floating(slot, value)
    if c.kind == "complex":
        return complex_number(slot, value)
    return aggregate(slot, value)


# --- the packer ---------------------------------------------------------------------

class Packer:
    """A kernel's parameter layout as one struct: builds the buffer and the void** array into
    it, the C packer's spec, and the packing step of a launch (`filler`)."""

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

    # kinds of the C packer by (C kind, size): _launch.c's K_I8..K_F64, which
    # tests/test_c_constants.py checks against these
    _C_KINDS = {("int", 1): 1, ("uint", 1): 2, ("int", 2): 3, ("uint", 2): 4, ("int", 4): 5,
                ("uint", 4): 6, ("int", 8): 7, ("uint", 8): 8, ("float", 4): 10, ("float", 8): 11}

    def c_kind(self, slot: ParamSlot) -> tuple[int, tuple | None]:
        """(the C packer's kind for this slot, the token a matching array carries)."""
        c = slot.ctype
        if c is not None and c.kind == "pointer" and c.typestr is not None:
            bits = dtypes.BITS.get(c.typestr)
            if bits is not None:   # kjit arrays of its bits are written too
                return K_ARRAY_BITS, (launch_key(c.typestr, self.device), launch_key(bits, self.device))
            return K_ARRAY, launch_key(c.typestr, self.device)
        return (self._C_KINDS.get((c.kind, c.size), K_PYTHON) if c is not None else K_PYTHON), None

    @functools.cached_property
    def _c_kinds(self) -> tuple[tuple[int, tuple | None], ...]:
        return tuple(self.c_kind(s) for s in self.slots)

    def c_spec(self) -> tuple[bytes, tuple]:
        """(spec, tokens) for the C packer: bytes of (int32 kind, int32 offset) per parameter,
        and per parameter the token of the arrays it takes (kind 21, a pointer to bfloat16 or
        a float8: the pair of its own token and its bits'). Kind 0 marks the slots only Python
        converts (structs, vectors, bools, halves, pointers of unknown type): `python_slots`.
        Made once per Packer: every launch configuration's launcher shares it."""
        return self._c_spec

    @functools.cached_property
    def _c_spec(self) -> tuple[bytes, tuple]:
        spec = b"".join(struct.pack("<ii", kind, s.offset)
                        for (kind, _), s in zip(self._c_kinds, self.slots))
        return spec, tuple(token for _, token in self._c_kinds)

    @functools.cached_property
    def python_slots(self) -> tuple[ParamSlot, ...]:
        """The slots the C packer leaves to Python; none: the C launcher can launch alone."""
        return tuple(s for s, (kind, _) in zip(self.slots, self._c_kinds) if kind == K_PYTHON)

    @functools.cached_property
    def pointer_indices(self) -> tuple[int, ...]:
        """Indices of the parameters that may receive a framework's array (its stream matters)."""
        return tuple(s.index for s in self.slots
                     if s.ctype is not None and s.ctype.kind in ("pointer", "word64"))

    def convert_all(self, args: tuple, pending: list) -> list:
        if len(args) != len(self.slots):
            raise self.count_error(len(args))
        return [convert(s, a, self.device, pending) for s, a in zip(self.slots, args)]

    def count_error(self, got: int) -> ArgumentError:
        names = ", ".join(s.name for s in self.slots)
        return ArgumentError(f"kernel {self.kernel_name} takes {len(self.slots)} arguments "
                             f"({names}), got {got}")

    def filler(self, buf: Any, pack: Callable | None = None) -> Callable[[tuple, list], None]:
        """The packing step of a launch, `fill(args, pending)`: writes every argument into
        `buf` (In/Out copies go to `pending`) or raises an ArgumentError naming the parameter.
        With `pack`, the C packer (kjit/runtime/_launch.c), it writes the common values (exact
        ints and floats, matching kjit arrays, learned framework arrays) and Python converts
        the slots it leaves; without, per-slot checks in Python take the common values and
        the careful converters the rest. Anything unusual goes to `careful`."""
        return self._python_fill(buf) if pack is None else self._c_fill(buf, pack)

    def careful(self, buf: Any, args: tuple, pending: list) -> None:
        """The careful converters alone: they pack every argument or name what is wrong."""
        try:
            self.struct.pack_into(buf, 0, *self.convert_all(args, pending))
        except (struct.error, OverflowError):
            pending.clear()
            raise self._refused(args) from None
        except BaseException:
            pending.clear()
            raise

    def _refused(self, args: tuple) -> ArgumentError:
        """After struct refused a value the converters let through (an address beyond 64
        bits): the parameter it was for, found by packing each one alone."""
        for s, a in zip(self.slots, args):
            if isinstance(a, _HostTransfer):   # converting it would allocate and copy
                continue
            try:
                struct.pack("<" + slot_format(s), convert(s, a, self.device, []))
            except (struct.error, OverflowError) as exc:
                return ArgumentError(f"{s.describe()}: {a!r} does not fit the parameter's "
                                     f"{s.size} bytes ({exc})")
        return ArgumentError(f"kernel {self.kernel_name}: an argument could not be packed")

    def _fast_failed(self, exc: BaseException, buf: Any, args: tuple, pending: list) -> None:
        """A packing step's common path failed: a value struct refused goes to the careful
        converters, which pack it or name its parameter; anything else is raised. Either
        way the copies made so far are dropped (on an error nothing runs: no Out copies)."""
        pending.clear()
        if not isinstance(exc, (struct.error, OverflowError)):
            raise exc
        self.careful(buf, args, pending)

    def _c_fill(self, buf: Any, pack: Callable) -> Callable[[tuple, list], None]:
        spec, tokens = self.c_spec()
        address, device = ctypes.addressof(buf), self.device
        rest = tuple((s, struct.Struct("<" + slot_format(s)).pack_into) for s in self.python_slots)

        def fill(args: tuple, pending: list) -> None:
            if pack(spec, tokens, args, address, DeviceArray):
                return self.careful(buf, args, pending)
            try:
                for s, pack_into in rest:
                    pack_into(buf, s.offset, convert(s, args[s.index], device, pending))
            except BaseException as exc:
                self._fast_failed(exc, buf, args, pending)
        return fill

    def _python_fill(self, buf: Any) -> Callable[[tuple, list], None]:
        device, pack_into, n = self.device, self.struct.pack_into, len(self.slots)
        # the common values, tested inline: a kjit array carrying the slot's token for a typed
        # pointer (then its address), a float for a float; ints go straight to pack_into, which
        # refuses floats and out-of-range values. Anything else: the slot's careful converter.
        typed, floats, rest = [], [], []
        for s in self.slots:
            c = s.ctype
            if c is not None and c.kind == "pointer" and c.typestr is not None:
                bits = dtypes.BITS.get(c.typestr, c.typestr)   # bfloat16: its bits as uint16
                typed.append((s.index, launch_key(c.typestr, device), launch_key(bits, device), s))
            elif c is not None and c.kind == "float":
                floats.append((s.index, s))
            elif c is None or c.kind not in ("int", "uint"):
                rest.append((s.index, s))
        typed_, floats_, rest_ = tuple(typed), tuple(floats), tuple(rest)

        def fill(args: tuple, pending: list) -> None:
            if len(args) != n:
                raise self.count_error(len(args))
            values = list(args)
            try:
                for i, key, bits, s in typed_:
                    a = values[i]
                    values[i] = a.ptr if type(a) is DeviceArray and (a.launch_key is key or
                                                                     a.launch_key is bits) else \
                        convert(s, a, device, pending)
                for i, s in floats_:
                    if type(values[i]) is not float:
                        values[i] = convert(s, values[i], device, pending)
                for i, s in rest_:
                    values[i] = convert(s, values[i], device, pending)
                pack_into(buf, 0, *values)
            except BaseException as exc:
                self._fast_failed(exc, buf, args, pending)
        return fill
