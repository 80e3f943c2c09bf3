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
from .families import older_driver

_lock = threading.Lock()
_initialized = False
_unavailable: CudaUnavailableError | None = None
_has_device: bool | None = None   # available()'s yes, once given
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


def raise_for(err, what: str, hint: str = "", context: Any = None) -> None:
    """Raise the DriverError for a non-success CUresult (or its int). A sticky error (a
    fault inside a kernel) leaves the process unable to use CUDA (the device named is the
    current context's unless `context` is given): its message says so, and so does every
    later error."""
    drv = bindings()
    try:
        err = drv.CUresult(int(err))   # the C launch call returns a plain int
    except ValueError:   # a code this version of the bindings does not know
        pass
    name, text = _name_and_text(drv, err)
    code = int(err)
    if name in _STICKY or _broken:
        _key, device = _context_of(context)
        first = _broken.get(_PROCESS)
        if first is None and name in _STICKY:
            _broken[_PROCESS] = (code, name, text, what, device)
            hint = _join(hint, f"This error is sticky: the CUDA driver fails every later call of "
                               f"this process, on {_device_words(device)} and on every other device "
                               "alike (in kjit and in PyTorch or CuPy, which share the driver). "
                               "Start a new process; with one process per GPU (torchrun, "
                               "torch.multiprocessing) only this process is lost.")
        elif first is not None:
            if name != first[1]:   # another code (a puzzle on its own): report the cause
                hint = _join(hint, f"(this call returned {name})")
                code, name, text = first[0], first[1], first[2]
            hint = _join(hint, f"CUDA has been unusable in this process since an earlier "
                               f"{first[1]} on {_device_words(first[4])} (reported by {first[3]}); "
                               "every CUDA call of this process fails, on every device. Start a "
                               "new process.")
    elif name.startswith("CUDA_ERROR_STREAM_CAPTURE") or name == "CUDA_ERROR_CAPTURED_EVENT":
        hint = _join(hint, _CAPTURE_HINT)
    elif name == "CUDA_ERROR_CONTEXT_IS_DESTROYED":
        hint = _join(hint, _DESTROYED_HINT)
    raise DriverError(code, name, call=what, description=text, hint=hint)


# A fault inside a kernel (illegal address, trap, misaligned access...) is sticky: the driver
# then fails every later call of the process, in every context of every device (retaining
# another device's primary context included, from any thread), and only a new process gets
# the GPUs back.
_STICKY = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_CONTAINED"})
# the process's first sticky error: (code, name, description, call, device ordinal or None)
_PROCESS = "process"
_broken: dict[str, tuple[int, str, str, str, int | None]] = {}

_CAPTURE_HINT = (
    "A stream capture (CUDA graph) is in progress and this call cannot be part of it: make "
    "arrays (kjit.zeros/empty/to_device), host copies (kjit.In/Out) and synchronizations "
    "before or after the capture, launch each kernel once before it (the first launch on a "
    "device loads its module), and launch on the capturing stream: k[grid, block, stream].")


# kjit destroys no context it launches in, so the one current was destroyed by code outside
# it; what it held there is gone, and its handle (still current) fails every call
_DESTROYED_HINT = (
    "The current context was destroyed by code outside kjit: a device reset (cudaDeviceReset, "
    "cuDevicePrimaryCtxReset, cupy.cuda.runtime.deviceReset(), numba.cuda.close()) or "
    "cuCtxDestroy. The modules, arrays, streams and graphs made in it went with it, and every "
    "call in it now fails. Start a new process, and keep device resets out of processes that "
    "use kjit (a reset also frees the memory of PyTorch and CuPy arrays).")


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def _device_words(device: int | None) -> str:
    return f"device {device}" if device is not None else "the device"


def _context_of(context: Any) -> tuple[tuple[int, int] | None, int | None]:
    """((context, epoch), device ordinal) of `context`, or of the current one if None; never
    raises (it runs while an error is being reported)."""
    try:
        drv = bindings()
        device = None
        if context is None:
            err, context = drv.cuCtxGetCurrent()
            if err or not int(context):
                return None, None
            err, dev = drv.cuCtxGetDevice()
            device = None if err else int(dev)
        if not int(context):
            return None, None
        if device is None:
            device = next((o for o, c in _primary.items() if int(c) == int(context)), None)
        return (int(context), context_epoch(context)), device
    except Exception:   # no driver library: nothing to key on
        return None, None


# cuInit takes tens of milliseconds inside the driver, and cuda.bindings holds the GIL through
# it. compile(arch=None) starts it on a helper thread through ctypes (which releases the GIL)
# before importing the compile path, so those imports and cuda.bindings' own overlap it;
# init() then waits for it, and its own cuInit returns at once. When this cuInit is the
# process's first, no thread can have a current context yet, so the calling thread's device is
# its default one: the helper goes on to make that device's primary context (see
# warm_primary_context), which the load that usually follows needs.
_starting: threading.Thread | None = None
_started = threading.Event()   # the helper's cuInit has returned
_NOT_INITIALIZED = 3           # CUDA_ERROR_NOT_INITIALIZED


def _init_in_background(device: int | None) -> None:
    import ctypes
    try:
        lib = libcuda_ctypes()
        count = ctypes.c_int()
        first = lib.cuDeviceGetCount(ctypes.byref(count)) == _NOT_INITIALIZED
        ok = lib.cuInit(0) == 0
    except Exception:   # no driver: init() says so
        return
    finally:
        _started.set()
    if device is None or not (ok and first):
        return
    if lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and 0 <= device < count.value:
        with _warm_lock:
            if device in _primary or device in _warming:
                return
            _warming[device] = threading.current_thread()
        _retain_in_background(device)


def start_init(context: bool = True) -> None:
    """Start cuInit in the background (no-op once done or started); init() waits for it.
    context=False: never go on to make a context (a compile for a given arch, where NVRTC's
    first compile calls cuInit itself)."""
    global _starting
    if _initialized or _starting is not None or _unavailable is not None:
        return
    with _lock:
        if _starting is None:
            device = getattr(_tls, "default_device", 0) if context else None
            _starting = threading.Thread(target=_init_in_background, name="kjit-cuinit",
                                         args=(device,), daemon=True)
            _starting.start()


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
            drv = bindings()   # its import overlaps a cuInit start_init began
            if _starting is not None:
                _started.wait()
            (err,) = drv.cuInit(0)
        except Exception as exc:  # DynamicLibNotFoundError, OSError, RuntimeError from the loader
            _unavailable = CudaUnavailableError(
                "no CUDA driver found (libcuda.so could not be loaded): kjit can compile, link "
                "with nvJitLink and build fatbins here, but loading and launching need a machine "
                f"with an NVIDIA GPU and driver [{type(exc).__name__}]")
            raise _unavailable from None
        problem = older_driver(drv)   # wheels of a newer CUDA major than the driver
        if problem is None and err != drv.CUresult.CUDA_SUCCESS:
            name, text = _name_and_text(drv, err)
            problem = (f"the CUDA driver is present but cuInit failed: {name}: {text}. "
                       "Check that a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES).")
        if problem is not None:
            _unavailable = CudaUnavailableError(problem)
            raise _unavailable
        _initialized = True


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


# Callbacks run when kjit destroys a context: tables keyed by a context's address alone
# (the C fast path of @kjit.kernel) drop their entries for it.
context_destroyed_hooks: list[Callable[[int], None]] = []


def context_destroyed(ctx: Any) -> None:
    _epochs[int(ctx)] = _epochs.get(int(ctx), 0) + 1
    for hook in list(context_destroyed_hooks):
        hook(int(ctx))


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
_warm_lock = threading.Lock()   # one helper per device


def libcuda_ctypes() -> Any:
    """libcuda through ctypes (the copy cuda.bindings loaded: dlopen finds it), for calls that
    must release the GIL or that cuda.bindings gets wrong; OSError without a driver."""
    import ctypes
    return ctypes.CDLL("libcuda.so.1")


def _retain_in_background(ordinal: int) -> None:
    import ctypes
    try:
        lib = libcuda_ctypes()
        dev = ctypes.c_int()
        ctx = ctypes.c_void_p()
        if lib.cuDeviceGet(ctypes.byref(dev), ordinal) == 0 and \
                lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
            _warm_retained[ordinal] = dev.value
    except Exception:   # the thread that needs the context makes it and reports any error
        pass


def making_context() -> bool:
    """Whether a primary context is still being made on a helper thread."""
    return any(t.is_alive() for t in _warming.values())


def warm_primary_context(ordinal: int) -> None:
    """Start making device `ordinal`'s primary context in the background (no-op once retained
    or started); primary_context() waits for it."""
    with _warm_lock:
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
        libcuda_ctypes().cuDevicePrimaryCtxRelease_v2(dev)


@atexit.register
def _join_warming() -> None:
    """Never leave a cuInit or a context half-made inside the driver while the process exits."""
    for t in [_starting, *_warming.values()]:
        if t is not None:
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


def context_device(ctx: Any) -> int | None:
    """The ordinal of the device a context runs on (None: no context, or one the driver does
    not know)."""
    if not ctx or not int(ctx):
        return None
    for ordinal, primary in _primary.items():
        if int(primary) == int(ctx):
            return ordinal
    drv = bindings()
    (err,) = drv.cuCtxPushCurrent(drv.CUcontext(int(ctx)))
    if err:
        return None
    try:
        err, dev = drv.cuCtxGetDevice()
        return None if err else int(dev)
    finally:
        drv.cuCtxPopCurrent()


class context_pushed:
    """Within this block `ctx` is the thread's current context (pushed on its stack when
    another one is current, popped at the end): a launch or load on a device that is not
    the current one, leaving the thread's own choice of device as it was."""

    __slots__ = ("ctx", "pushed")

    def __init__(self, ctx: Any):
        self.ctx = ctx

    def __enter__(self) -> Any:
        current = current_context()
        self.pushed = current is None or int(current) != int(self.ctx)
        if self.pushed:
            call(bindings().cuCtxPushCurrent, self.ctx)
        return self.ctx

    def __exit__(self, *exc: Any) -> None:
        if self.pushed:
            call(bindings().cuCtxPopCurrent)


def set_default_device(ordinal: int) -> int:
    """Set this thread's default device; return the previous one."""
    prev = getattr(_tls, "default_device", 0)
    _tls.default_device = ordinal
    return prev
