"""Launch dimensions: a grid, block or cluster shape given as an int or a tuple of one to
three ints, checked into the (x, y, z) the driver takes.

Its own module because the JAX bridge (`jax_op`) checks shapes too and cannot import the
kernel module, which imports it when a kernel becomes a JAX op."""
from __future__ import annotations

from typing import Any

from ..errors import ArgumentError


def dim3(value: Any, what: str) -> tuple[int, int, int]:
    """`value` as (x, y, z), each in 1..2**32-1; an ArgumentError naming `what` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        dims = (value, 1, 1)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(value) + (1,) * (3 - len(value))
    else:
        raise ArgumentError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < 2**32:
            raise ArgumentError(f"{what} dimensions must be ints in 1..2**32-1, got {value!r}")
    return dims  # type: ignore[return-value]
