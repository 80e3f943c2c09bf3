"""A HIP launch's configuration (checked against AMD's limits) and its packed argument buffer."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from ...errors import ArgumentError
from .streams import stream_handle

# hip_runtime_api.h (HIP-Clang / AMD platform).
HIP_LAUNCH_PARAM_BUFFER_POINTER = 1
HIP_LAUNCH_PARAM_BUFFER_SIZE = 2
HIP_LAUNCH_PARAM_END = 3
hipMemcpyHostToDevice, hipMemcpyDeviceToHost, hipMemcpyDeviceToDevice = 1, 2, 3

# AMD limits hipModuleLaunchKernel enforces: 1024 work-items per block, and each grid
# dimension in work-items (blocks x threads) must fit in 32 bits (HSA dispatch packet).
MAX_BLOCK_THREADS = 1024
MAX_GRID_WORKITEMS = 2**32 - 1


def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if dims is None or not 1 <= len(dims) <= 3 or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dims):
        raise ArgumentError(f"{what} must be a positive int or a tuple of 1-3 positive ints, "
                            f"got {value!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]


@dataclass(frozen=True)
class LaunchConfig:
    """Grid (in blocks), block (in threads), dynamic shared memory and stream of a launch,
    validated against the limits hipModuleLaunchKernel enforces on AMD GPUs."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    stream: int = 0  # hipStream_t; 0 is the null stream

    @classmethod
    def make(cls, grid: Any, block: Any, shared_mem: int = 0, stream: Any = None) -> "LaunchConfig":
        g, b = _dim3(grid, "grid"), _dim3(block, "block")
        threads = b[0] * b[1] * b[2]
        if threads > MAX_BLOCK_THREADS:
            raise ArgumentError(f"block {b} has {threads} threads; AMD GPUs allow at most "
                                f"{MAX_BLOCK_THREADS} per block")
        for axis, (gd, bd) in zip("xyz", zip(g, b)):
            if gd * bd > MAX_GRID_WORKITEMS:
                raise ArgumentError(
                    f"grid {axis}: {gd} blocks x {bd} threads = {gd * bd} work-items; HIP on AMD "
                    f"allows at most {MAX_GRID_WORKITEMS} per dimension")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or shared_mem < 0:
            raise ArgumentError(f"shared_mem must be a non-negative int (bytes), got {shared_mem!r}")
        return cls(g, b, shared_mem, stream_handle(stream))


class HipParams:
    """A packed kernel-argument buffer and the `extra` array hipModuleLaunchKernel reads it
    through. Built once per kernel: refilling the buffer in place needs no new array.

    `buffer` is bytes (copied), or a bytearray / ctypes buffer (used in place, so the
    caller's packer can write into it between launches).
    """

    __slots__ = ("buffer", "size", "_size", "extra")

    def __init__(self, buffer: Any, size: int | None = None):
        if isinstance(buffer, (bytes, memoryview)):
            data = bytes(buffer)
            buffer = ctypes.create_string_buffer(data, max(len(data), 1))
            size = len(data) if size is None else size
        elif isinstance(buffer, bytearray):
            n = len(buffer)
            buffer = (ctypes.c_char * max(n, 1)).from_buffer(buffer if n else bytearray(1))
            size = n if size is None else size
        elif not isinstance(buffer, ctypes.Array):
            raise ArgumentError("kernel parameters must be packed bytes, a bytearray or a ctypes "
                                f"buffer, got {type(buffer).__name__}")
        capacity = ctypes.sizeof(buffer)
        size = capacity if size is None else int(size)
        if not 0 <= size <= capacity:
            raise ArgumentError(f"parameter size {size} exceeds the {capacity}-byte buffer")
        self.buffer = buffer
        self._size = ctypes.c_size_t(size)
        self.size = size
        self.extra = (ctypes.c_void_p * 5)(
            HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(buffer),
            HIP_LAUNCH_PARAM_BUFFER_SIZE, ctypes.addressof(self._size),
            HIP_LAUNCH_PARAM_END)

