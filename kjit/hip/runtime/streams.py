"""HIP streams, and the hipStream_t of whatever a caller passes as one."""
from __future__ import annotations

import ctypes
from typing import Any

from ...errors import ArgumentError
from .calls import call


def stream_handle(stream: Any) -> int:
    """The hipStream_t (as an int) of None (null stream), an int handle or a HipStream."""
    if stream is None:
        return 0
    if isinstance(stream, HipStream):
        return stream.handle
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise ArgumentError(f"stream must be None, a kjit HipStream or a hipStream_t int, got {stream!r}")


class HipStream:
    """A HIP stream (hipStreamCreate); pass it as `stream=` to launches and copies."""

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        call("hipStreamCreate", ctypes.byref(handle))
        self.handle: int = handle.value or 0

    def synchronize(self) -> None:
        call("hipStreamSynchronize", self.handle)

    def close(self) -> None:
        if self.handle:
            handle, self.handle = self.handle, 0
            call("hipStreamDestroy", handle)

    def __enter__(self) -> "HipStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

