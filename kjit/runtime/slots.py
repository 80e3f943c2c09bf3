"""Where each kernel parameter lives in the argument buffer, and the struct format that writes
it. The lowest piece of argument handling: the converters (scalars, pointers, aggregates) name
a parameter through its slot, and the Packer lays the slots out in one struct."""
from __future__ import annotations

from typing import NamedTuple

from ..errors import ArgumentError
from .cdecl import CType


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


SCALAR_FORMATS = {("word64", 8): "Q", ("int", 1): "b", ("int", 2): "h", ("int", 4): "i",
                  ("int", 8): "q", ("uint", 1): "B", ("uint", 2): "H", ("uint", 4): "I",
                  ("uint", 8): "Q", ("float", 2): "e", ("float", 4): "f", ("float", 8): "d",
                  ("bool", 1): "?"}


def slot_format(slot: ParamSlot) -> str:
    c = slot.ctype
    if c is not None and c.kind == "pointer":
        return "Q"
    if c is not None and (c.kind, c.size) in SCALAR_FORMATS:
        return SCALAR_FORMATS[(c.kind, c.size)]
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


# --- the framework bridges' reading of a signature (as_torch_op, as_jax_op) -------------------
def check_outputs(slots: "list[ParamSlot] | tuple", kernel: str, outputs: dict) -> None:
    """ArgumentError for names in `outputs` that are not the kernel's parameters."""
    unknown = sorted(set(outputs) - {s.name for s in slots})
    if unknown:
        raise ArgumentError(f"kernel {kernel}: outputs names {unknown}, which are not its "
                            f"parameters ({', '.join(s.name for s in slots)})")


def pointer_role(slot: ParamSlot, kernel: str, outputs: dict) -> str:
    """A pointer parameter's role: "output" (named in `outputs`: a result the call allocates;
    a pointer to const cannot be one), "input" (to const) or "written" (the kernel may write
    it)."""
    const = slot.ctype is not None and slot.ctype.const
    if slot.name in outputs:
        if const:
            raise ArgumentError(f"kernel {kernel}: {slot.describe()} points to const, so the "
                                "kernel cannot write it; it cannot be an output")
        return "output"
    return "input" if const else "written"
