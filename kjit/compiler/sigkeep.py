"""The process's signal dispositions, kept across NVRTC's first compile.

NVRTC 12's first nvrtcCompileProgram re-installs the handlers of SIGINT, SIGTERM and SIGXFSZ
with SA_RESTART: Python's own SIGINT handler stays, but a blocking call (opening a FIFO no
one reads, reading a pipe) is then restarted after Ctrl-C instead of failing with EINTR, so
Python never raises KeyboardInterrupt and the process hangs on. Every disposition the
compile changed is put back as it was; later compiles change nothing (NVRTC 13 never does).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

_SIGNALS = range(1, 32)   # the standard signals (SIGKILL and SIGSTOP cannot change)
_state: dict[str, Any] = {"done": False, "libc": None, "struct": None}


def _sigaction() -> tuple[Any, Any] | None:
    if _state["libc"] is None:
        import ctypes

        class Sigaction(ctypes.Structure):   # glibc's struct sigaction (x86-64, aarch64)
            _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                        ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]
        try:
            _state["libc"] = ctypes.CDLL(None, use_errno=True).sigaction
        except (OSError, AttributeError):
            _state["libc"] = False
        _state["struct"] = Sigaction
    return (_state["libc"], _state["struct"]) if _state["libc"] else None


def _read(fn: Any, cls: Any) -> dict[int, Any]:
    import ctypes
    out = {}
    for sig in _SIGNALS:
        sa = cls()
        if fn(sig, None, ctypes.byref(sa)) == 0:
            out[sig] = sa
    return out


def _fields(sa: Any) -> tuple:
    # the kernel keeps 64 signals: glibc fills the rest of sa_mask from its stack
    return sa.handler, sa.flags, sa.mask[0]


@contextlib.contextmanager
def kept(needed: bool = True) -> Iterator[None]:
    """Run the block (a compile); put back any signal disposition it changed. Only until one
    such block has finished: the change comes with NVRTC's first compile in a process.
    needed=False (an NVRTC that changes none, 13 and later): the block runs as it is."""
    got = (None if not needed or _state["done"] or not sys.platform.startswith("linux")
           else _sigaction())
    if got is None:
        yield
        return
    import ctypes
    fn, cls = got
    before = _read(fn, cls)
    try:
        yield
    finally:
        for sig, sa in _read(fn, cls).items():
            old = before.get(sig)
            if old is not None and _fields(old) != _fields(sa):
                fn(sig, ctypes.byref(old), None)
        _state["done"] = True
