"""The one checked way to call the CUDA driver.

Nothing here runs at import: the bindings' driver module is imported and cuInit is called
on first use. Every call goes through `call`, which turns a non-success CUresult into a
DriverError with all three names, and a missing libcuda into CudaUnavailableError.
"""
from __future__ import annotations

import atexit
import functools
import threading
from typing import Any, Callable

from .errors import CudaUnavailableError, DriverError

_lock = threading.Lock()
_initialized = False
_unavailable: CudaUnavailableError | None = None
_tls = threading.local()


def bindings():
    """cuda.bindings.driver, imported on first use (it costs nothing until then)."""
    from cuda.bindings import driver
    return driver


def _name_and_text(drv, err) -> tuple[str, str]:
    try:
        name = err.name
    except AttributeError:
        name = f"CUDA_ERROR_{int(err)}"
    try:
        res, text = drv.cuGetErrorString(err)
        text = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # the driver may be unable to describe errors (e.g. deinitialized)
        text = ""
    return name, text


def raise_for(err, what: str, hint: str = "") -> None:
    """Raise the DriverError for a non-success CUresult."""
    drv = bindings()
    name, text = _name_and_text(drv, err)
    raise DriverError(int(err), name, call=what, description=text, hint=hint)


def init() -> None:
    """cuInit once per process; CudaUnavailableError (remembered) when there is no driver."""
    global _initialized, _unavailable
    if _initialized:
        return
    with _lock:
        if _initialized:
            return
        if _unavailable is not None:  # a new instance each time, so tracebacks don't pile up
            raise CudaUnavailableError(str(_unavailable)) from None
        try:
            drv = bindings()
            (err,) = drv.cuInit(0)
        except Exception as exc:  # DynamicLibNotFoundError, OSError, RuntimeError from the loader
            _unavailable = CudaUnavailableError(
                "no CUDA driver found (libcuda.so could not be loaded): kjit can compile, link "
                "with nvJitLink and build fatbins here, but loading and launching need a machine "
                f"with an NVIDIA GPU and driver [{type(exc).__name__}]")
            raise _unavailable from None
        if err != drv.CUresult.CUDA_SUCCESS:
            name, text = _name_and_text(drv, err)
            _unavailable = CudaUnavailableError(
                f"the CUDA driver is present but cuInit failed: {name}: {text}. "
                "Check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES).")
            raise _unavailable
        _initialized = True


_has_device: bool | None = None


def available() -> bool:
    """True if a driver and at least one device exist. Never raises; a yes is remembered
    (devices don't vanish from a running process), a no is asked again."""
    global _has_device
    if _has_device:
        return True
    try:
        init()
        _has_device = device_count() > 0
    except Exception:
        return False
    return _has_device


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a cuda.bindings driver function, check its result, return its outputs.

    Returns None, the single output, or a tuple of outputs.
    """
    init()
    res = fn(*args)
    err = res[0]
    if err:  # CUresult is an int enum; CUDA_SUCCESS == 0
        raise_for(err, getattr(fn, "__name__", str(fn)))
    if len(res) == 1:
        return None
    if len(res) == 2:
        return res[1]
    return res[1:]


def driver_version() -> int:
    """cuDriverGetVersion: 13000 for CUDA 13.0."""
    return call(bindings().cuDriverGetVersion)


def device_count() -> int:
    return call(bindings().cuDeviceGetCount)


@functools.lru_cache(maxsize=None)
def compute_capability(ordinal: int = 0) -> tuple[int, int]:
    """(major, minor) of a device; asked once per device (compile with arch=None uses it)."""
    drv = bindings()
    dev = call(drv.cuDeviceGet, ordinal)
    attr = drv.CUdevice_attribute
    major = call(drv.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = call(drv.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return int(major), int(minor)


# --- contexts -----------------------------------------------------------------------
# The primary context of each device is retained once per process and made current in a
# thread on demand, so work started from any thread finds a context.

_primary: dict[int, Any] = {}
# A context's epoch grows each time kjit destroys a context at that address. Memory, streams
# and modules remember the epoch they were made in: once their context is gone, touching them
# (a late free, an unload) would crash the driver, so they are skipped; and a new context the
# driver puts at the same address starts a new epoch, so it never inherits the old one's state.
_epochs: dict[int, int] = {}


def context_epoch(ctx: Any) -> int:
    return _epochs.get(int(ctx), 0)


def context_destroyed(ctx: Any) -> None:
    _epochs[int(ctx)] = _epochs.get(int(ctx), 0) + 1


def primary_context(ordinal: int) -> Any:
    """The retained primary context of device `ordinal` (retained once per process)."""
    ctx = _primary.get(ordinal)
    if ctx is not None:
        return ctx
    with _lock:
        ctx = _primary.get(ordinal)
        if ctx is None:
            init()
            drv = bindings()
            count = device_count()
            if not 0 <= ordinal < count:
                raise CudaUnavailableError(
                    f"device {ordinal} does not exist: this machine has {count} CUDA device(s)")
            if ordinal in _warming:
                _warming[ordinal].join()   # the context is (being) made: this retain is quick
            dev = call(drv.cuDeviceGet, ordinal)
            ctx = call(drv.cuDevicePrimaryCtxRetain, dev)
            _drop_helper_reference(ordinal)
            _primary[ordinal] = ctx
    return ctx


# Creating a primary context takes ~100 ms inside the driver. compile(arch=None) needs only
# the device's compute capability, so it starts the context on a helper thread: the disk-cache
# hit and the imports of a fresh process's first load overlap it instead of waiting behind
# it. The helper calls libcuda through ctypes, which releases the GIL (cuda.bindings holds it
# through the call); primary_context() then retains the made context and drops the helper's
# reference, so the count is what it would have been.
_warming: dict[int, threading.Thread] = {}
_warm_retained: dict[int, Any] = {}


def _libcuda() -> Any:
    import ctypes
    return ctypes.CDLL("libcuda.so.1")   # the copy cuda.bindings loaded: dlopen finds it


def _retain_in_background(ordinal: int) -> None:
    import ctypes
    try:
        lib = _libcuda()
        dev = ctypes.c_int()
        ctx = ctypes.c_void_p()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0 and \
                lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
            _warm_retained[ordinal] = dev.value
    except Exception:   # the thread that needs the context makes it and reports any error
        pass


def warm_primary_context(ordinal: int) -> None:
    """Start making device `ordinal`'s primary context in the background (no-op once retained
    or started); primary_context() waits for it."""
    if ordinal in _primary or ordinal in _warming:
        return
    t = threading.Thread(target=_retain_in_background, args=(ordinal,), name="kjit-context",
                         daemon=True)
    _warming[ordinal] = t
    t.start()


def _drop_helper_reference(ordinal: int) -> None:
    """Release the finished helper's retain (ours was just taken)."""
    dev = _warm_retained.pop(ordinal, None)
    if dev is not None:
        _libcuda().cuDevicePrimaryCtxRelease_v2(dev)


@atexit.register
def _join_warming() -> None:
    """Never leave a context half-made inside the driver while the process exits."""
    for t in list(_warming.values()):
        t.join(timeout=30)


def thread_device() -> int:
    """The device of this thread's current context, else its default device (kjit.Device):
    what ensure_context() would use, without creating a context."""
    if current_context() is not None:
        return int(call(bindings().cuCtxGetDevice))
    return getattr(_tls, "default_device", 0)


def current_context() -> Any | None:
    """The context current in this thread, or None."""
    ctx = call(bindings().cuCtxGetCurrent)
    return ctx if int(ctx) else None


def current_device() -> int:
    """The device of the current context; device 0's primary context is made current if none is."""
    ensure_context()
    return int(call(bindings().cuCtxGetDevice))


def ensure_context() -> Any:
    """Make sure this thread has a current context; return it.

    A thread with no current context gets the primary context of the device the user chose
    with kjit.Device (default 0).
    """
    ctx = current_context()
    if ctx is None:
        ctx = primary_context(getattr(_tls, "default_device", 0))
        call(bindings().cuCtxSetCurrent, ctx)
    return ctx


def set_default_device(ordinal: int) -> int:
    """Set this thread's default device; return the previous one."""
    prev = getattr(_tls, "default_device", 0)
    _tls.default_device = ordinal
    return prev
