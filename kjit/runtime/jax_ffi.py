"""kjit's XLA FFI target for JAX operators: registering the handler kjit ships (the C extension
kjit/runtime/_xla.c, so a JAX user builds nothing), the plans the handler reads (a kernel's
CUfunction per CUDA context, and where each kernel parameter comes from), and loading a
kernel's module in every GPU JAX has.

Modules are loaded when a call is traced, for every CUDA device JAX has, never in the handler:
the handler runs on XLA's threads, without Python, and possibly inside a CUDA-graph capture
(XLA's command buffers), where loading a module is not allowed. Loading is once per device
and kernel (the kernel's code comes from kjit's cache). JAX is imported only here and in
jax_op, when an operator is made or called.
"""
from __future__ import annotations

import os
import re
import threading
from typing import Any

from ..errors import KjitError

TARGET = "kjit_launch"
P_ARG, P_RET, P_SCALAR = 0, 1, 2   # the plan's kinds, as _xla.c numbers them (tests/test_c_constants.py)
KNOWN_MAJOR = 0                    # the FFI ABI _xla.c declares (API 0.x, x >= 1)

_lock = threading.Lock()
_registered: tuple[int, int] | None = None


def extension() -> Any:
    """kjit.runtime._xla, or KjitError saying why JAX operators are unavailable."""
    try:
        from . import _xla
    except ImportError as exc:
        raise KjitError(
            "kjit's XLA handler (the C extension kjit.runtime._xla) is not built, so kernels "
            f"cannot become JAX operators ({exc}). Reinstall kjit where a C compiler is "
            "available (pip install --force-reinstall --no-binary kjit 'kjit[jax]')") from None
    return _xla


def framework_api_version(include_dir: str | None = None) -> tuple[int, int]:
    """The XLA FFI API version of the installed jaxlib, read from the c_api.h it ships: XLA
    registers a handler only if it reports exactly this version."""
    if include_dir is None:
        import jax.ffi
        include_dir = jax.ffi.include_dir()
    path = os.path.join(include_dir, "xla", "ffi", "api", "c_api.h")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError as exc:
        raise KjitError(f"kjit cannot tell this jaxlib's XLA FFI version: {path} is not readable "
                        f"({exc.strerror}); install jaxlib 0.5 or newer") from None
    found = [re.search(rf"^\s*#define\s+XLA_FFI_API_{w}\s+(\d+)", text, re.M) for w in ("MAJOR", "MINOR")]
    if not all(found):
        raise KjitError(f"kjit cannot tell this jaxlib's XLA FFI version: {path} defines no "
                        "XLA_FFI_API_MAJOR/MINOR")
    return int(found[0].group(1)), int(found[1].group(1))   # type: ignore[union-attr]


def check_api_version(version: tuple[int, int]) -> None:
    major, minor = version
    if major != KNOWN_MAJOR or minor < 1:
        raise KjitError(
            f"this jaxlib's XLA FFI API is version {major}.{minor}; kjit's handler is written for "
            f"{KNOWN_MAJOR}.x (x >= 1), whose call frame it reads. Use a jax/jaxlib kjit supports "
            "(docs/jax.md) or a kjit release that knows this version")


def register() -> None:
    """Register kjit's handler as the FFI target `kjit_launch`: the launching handler for CUDA,
    and for the CPU one that refuses the call saying it needs a GPU. Once per process."""
    global _registered
    if _registered is not None:
        return
    with _lock:
        if _registered is not None:
            return
        import jax
        ext = extension()
        version = framework_api_version()
        check_api_version(version)
        ext.set_api_version(*version)   # what the handler answers XLA's metadata query
        traits = _command_buffer_trait()
        for platform, gpu in (("CUDA", True), ("cpu", False)):
            try:
                jax.ffi.register_ffi_target(TARGET, ext.handler(gpu), platform=platform,
                                            api_version=1, **traits)
            except TypeError:   # a jaxlib whose registration takes no traits: the metadata has them
                jax.ffi.register_ffi_target(TARGET, ext.handler(gpu), platform=platform, api_version=1)
        _registered = version


def _command_buffer_trait() -> dict[str, Any]:
    """The registration's traits argument where jaxlib has one (the handler's metadata says the
    same to an XLA that asks)."""
    try:
        from jax._src.lib import xla_client
        return {"traits": xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}
    except (ImportError, AttributeError):
        return {}


def cuda_devices() -> list[Any]:
    """JAX's CUDA devices here (none without a CUDA backend)."""
    import jax
    for backend in ("cuda", "gpu"):   # the CUDA plugin's name, then the generic one
        try:
            return list(jax.local_devices(backend=backend))
        except RuntimeError:
            continue
    return []



class Plan:
    """One operator's plan in the handler's table: its index (the call's `kjit_plan`
    attribute) and the devices its kernel is loaded in."""

    def __init__(self, target: Any, kernel: str, kinds: list[int], wheres: list[int], nargs: int,
                 nrets: int):
        import array
        ext = extension()
        if len(kinds) > ext.MAX_PARAMS:
            from ..errors import ArgumentError
            raise ArgumentError(f"kernel {kernel}: {len(kinds)} parameters; kjit's XLA handler "
                                f"launches kernels of at most {ext.MAX_PARAMS}: pass an array of them")
        self.target = target
        self.kernel = kernel
        self.index = ext.add_plan(kernel, array.array("i", kinds).tobytes(),
                                          array.array("i", wheres).tobytes(), nargs, nrets)
        self._loaded: set[int] = set()
        self._lock = threading.Lock()

    def load_everywhere(self) -> None:
        """Load the kernel in every CUDA device JAX has (primary contexts, as XLA uses) and tell
        the handler each context's CUfunction. Cheap once done: a set lookup per device."""
        devices = cuda_devices()
        ordinals = [_ordinal(d) for d in devices]
        if all(o in self._loaded for o in ordinals):
            return
        ext = extension()
        ext.bind()
        with self._lock:
            for ordinal in ordinals:
                if ordinal not in self._loaded:
                    k = kernel_on(self.target, ordinal)
                    ext.set_function(self.index, k.context_address, int(k.handle))
                    self._loaded.add(ordinal)


def _ordinal(device: Any) -> int:
    """The CUDA ordinal of a JAX device (local_hardware_id where jaxlib has it)."""
    hw = getattr(device, "local_hardware_id", None)
    return int(hw if hw is not None else device.id)


def kernel_on(target: Any, ordinal: int) -> Any:
    """The loaded Kernel of `target` (a Kernel or an @kjit.kernel function) in device
    `ordinal`'s primary context, compiled (or found in kjit's cache) and loaded there."""
    twin = getattr(target, "_twin_on", None)
    if twin is not None:   # a loaded Kernel: its module's kernel in that device
        return twin(ordinal)
    from .context import Device
    with Device(ordinal):
        return target.kernel()
