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
import struct
from typing import Any, Callable

from ..errors import ArgumentError
from .aggregates import aggregate, raw_bytes
from .dtypes import is_numpy
from .memory import DeviceArray, launch_key
from .pointers import pointer, ptr
from .scalars import floating, integer
from .slots import ParamSlot, layout, slot_format

__all__ = ["ParamSlot", "Packer", "convert", "layout", "ptr", "slot_format"]


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
    return aggregate(slot, value)


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
