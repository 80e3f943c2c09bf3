"""Devices and contexts.

By default every device's primary context (the one CuPy and PyTorch use) is retained once
and made current in whichever thread needs it. `kjit.Device(i)` selects a device for a
block of code; `kjit.Context` is an explicit context (cuCtxCreate) for plugin-style isolation.
"""
from __future__ import annotations

import threading
from typing import Any

from .. import driver
from ..errors import DriverError, KjitError


class Device:
    """A CUDA device. `with kjit.Device(1): ...` makes its primary context current in this
    thread (as torch.cuda.device(1) and cupy.cuda.Device(1) do): kernels launched inside run
    on device 1, and arrays made inside live there."""

    def __init__(self, ordinal: int = 0):
        if isinstance(ordinal, bool) or not isinstance(ordinal, int) or ordinal < 0:
            raise KjitError(f"device ordinal must be an int >= 0, got {ordinal!r}")
        self.ordinal = ordinal
        self._local = threading.local()   # each thread entering this Device restores its own

    @property
    def _saved(self) -> list[tuple[int, Any]]:
        saved = getattr(self._local, "saved", None)
        if saved is None:
            saved = self._local.saved = []
        return saved

    @property
    def context(self) -> Any:
        """The retained primary context."""
        return driver.primary_context(self.ordinal)

    @property
    def arch(self) -> str:
        major, minor = driver.compute_capability(self.ordinal)
        return f"sm_{major}{minor}"

    @property
    def name(self) -> str:
        drv = driver.bindings()
        dev = driver.call(drv.cuDeviceGet, self.ordinal)
        return driver.call(drv.cuDeviceGetName, 256, dev).split(b"\0")[0].decode()

    def attribute(self, name: str) -> int:
        """A device attribute by its short name, e.g. "multiprocessor_count"."""
        drv = driver.bindings()
        attr = getattr(drv.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + name.upper())
        dev = driver.call(drv.cuDeviceGet, self.ordinal)
        return int(driver.call(drv.cuDeviceGetAttribute, attr, dev))

    def can_access_peer(self, peer: "int | Device") -> bool:
        """Whether kernels on this device can read and write `peer`'s memory directly."""
        drv = driver.bindings()
        other = peer.ordinal if isinstance(peer, Device) else int(peer)
        dev, peer_dev = (driver.call(drv.cuDeviceGet, o) for o in (self.ordinal, other))
        return bool(driver.call(drv.cuDeviceCanAccessPeer, dev, peer_dev))

    def enable_peer_access(self, peer: "int | Device") -> None:
        """Let kernels on this device use `peer`'s memory: pass such memory as
        kjit.ptr(address), since kjit refuses an array of another device otherwise. Peer access
        is a choice the program makes explicitly (it maps memory across devices); enabling it
        twice is fine."""
        other = peer.ordinal if isinstance(peer, Device) else int(peer)
        if other == self.ordinal:
            return
        if not self.can_access_peer(other):
            raise KjitError(f"device {self.ordinal} cannot access device {other}'s memory directly "
                            "(no peer access between them): copy the data instead")
        drv = driver.bindings()
        with self:
            (err,) = drv.cuCtxEnablePeerAccess(driver.primary_context(other), 0)
        if err and err != drv.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            driver.raise_for(err, "cuCtxEnablePeerAccess")

    def synchronize(self) -> None:
        with self:
            synchronize()

    def __enter__(self) -> "Device":
        prev_dev = driver.set_default_device(self.ordinal)
        prev_ctx = driver.current_context()
        self._saved.append((prev_dev, prev_ctx))
        driver.call(driver.bindings().cuCtxSetCurrent, self.context)
        return self

    def __exit__(self, *exc: Any) -> None:
        prev_dev, prev_ctx = self._saved.pop()
        driver.set_default_device(prev_dev)
        driver.call(driver.bindings().cuCtxSetCurrent, prev_ctx if prev_ctx is not None else 0)

    def __repr__(self) -> str:
        return f"kjit.Device({self.ordinal})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.ordinal == self.ordinal

    def __hash__(self) -> int:
        return hash(("kjit.Device", self.ordinal))

    def __reduce__(self) -> tuple:
        return (Device, (self.ordinal,))   # the per-thread stack stays behind


class Context:
    """An explicit CUDA context (cuCtxCreate), isolated from the primary context.

    Use as a context manager: entering pushes it on this thread's stack, leaving pops it.
    `close()` destroys it; modules loaded in it must not be used afterwards.
    """

    def __init__(self, device: int | Device = 0, flags: int = 0):
        ordinal = device.ordinal if isinstance(device, Device) else int(device)
        driver.init()
        drv = driver.bindings()
        dev = driver.call(drv.cuDeviceGet, ordinal)
        try:  # CUDA 13: cuCtxCreate(params, flags, dev)
            self.handle = driver.call(drv.cuCtxCreate, None, flags, dev)
        except TypeError:  # CUDA 12 bindings: cuCtxCreate(flags, dev)
            self.handle = driver.call(drv.cuCtxCreate, flags, dev)
        # cuCtxCreate leaves the new context current; give the thread back its previous one.
        driver.call(drv.cuCtxPopCurrent)
        self.device = Device(ordinal)
        self._closed = False

    def push(self) -> None:
        self._check_open()
        driver.call(driver.bindings().cuCtxPushCurrent, self.handle)

    def pop(self) -> None:
        popped = driver.call(driver.bindings().cuCtxPopCurrent)
        if int(popped) != int(self.handle):
            driver.call(driver.bindings().cuCtxPushCurrent, popped)
            raise KjitError("kjit.Context.pop(): this context is not the current one")

    def synchronize(self) -> None:
        with self:
            synchronize()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            driver.context_destroyed(self.handle)
            driver.call(driver.bindings().cuCtxDestroy, self.handle)

    def _check_open(self) -> None:
        if self._closed:
            raise KjitError("this kjit.Context was closed")

    def __enter__(self) -> "Context":
        self.push()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pop()

    def __repr__(self) -> str:
        return f"kjit.Context(device={self.device.ordinal}, handle={int(self.handle):#x})"


# The kernel launched last in this process, so that an asynchronous fault reported by a later
# synchronize can name it. One list slot write per launch.
last_launch: list[str] = [""]


def synchronize() -> None:
    """Wait for all work in the current context; an asynchronous kernel fault is raised here
    as a DriverError that names the kernel launched last."""
    from .capture import check_not_capturing
    check_not_capturing("kjit.synchronize()")
    drv = driver.bindings()
    driver.ensure_context()
    (err,) = drv.cuCtxSynchronize()
    if err:
        raise_async(err, "cuCtxSynchronize")


def raise_async(err: Any, what: str, context: Any = None) -> None:
    try:
        driver.raise_for(err, what, context=context)
    except DriverError as exc:
        # a destroyed context fails the call itself: no queued work is to blame
        if last_launch[0] and exc.cuda_name != "CUDA_ERROR_CONTEXT_IS_DESTROYED":
            exc.hint = "\n".join(filter(None, [
                f"the fault came from work queued before this call; the kernel launched last "
                f"was {last_launch[0]!r}", exc.hint]))
        raise
