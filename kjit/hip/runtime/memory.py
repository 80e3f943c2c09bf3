"""HIP device memory: hipMalloc'd buffers with host copies."""
from __future__ import annotations

import ctypes
from typing import Any

from .calls import call
from ...errors import ArgumentError
from .launch import hipMemcpyDeviceToHost, hipMemcpyHostToDevice
from .streams import stream_handle

class HipBuffer:
    """Device memory from hipMalloc; int(buf) is its address (for pointer parameters)."""

    def __init__(self, nbytes: int):
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise ArgumentError(f"nbytes must be a positive int, got {nbytes!r}")
        ptr = ctypes.c_void_p()
        call("hipMalloc", ctypes.byref(ptr), nbytes)
        self.ptr: int = ptr.value or 0
        self.nbytes = nbytes

    def __int__(self) -> int:
        return self.ptr

    def _host(self, host: Any, nbytes: int | None, writable: bool) -> tuple[int, int, Any]:
        view = memoryview(host)
        if writable and view.readonly:
            raise ArgumentError("the host buffer to copy into is read-only")
        if not view.c_contiguous:
            raise ArgumentError("host buffers must be C-contiguous")
        n = view.nbytes if nbytes is None else nbytes
        if n > min(view.nbytes, self.nbytes):
            raise ArgumentError(f"copy of {n} bytes exceeds the host ({view.nbytes}) or device "
                                f"({self.nbytes}) buffer")
        holder = (ctypes.c_char * view.nbytes).from_buffer(view) if not view.readonly else \
            ctypes.create_string_buffer(view.tobytes(), view.nbytes)
        return ctypes.addressof(holder), n, holder

    def copy_from_host(self, host: Any, nbytes: int | None = None, stream: Any = None) -> None:
        addr, n, _keep = self._host(host, nbytes, writable=False)
        if stream is None:
            call("hipMemcpy", self.ptr, addr, n, hipMemcpyHostToDevice)
        else:
            call("hipMemcpyAsync", self.ptr, addr, n, hipMemcpyHostToDevice, stream_handle(stream))
            call("hipStreamSynchronize", stream_handle(stream))  # the staging copy dies here

    def copy_to_host(self, host: Any, nbytes: int | None = None) -> None:
        addr, n, _keep = self._host(host, nbytes, writable=True)
        call("hipMemcpy", addr, self.ptr, n, hipMemcpyDeviceToHost)

    def free(self) -> None:
        if self.ptr:
            ptr, self.ptr = self.ptr, 0
            call("hipFree", ptr)

    def __enter__(self) -> "HipBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()
