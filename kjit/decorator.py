"""@kjit.kernel: a Python function that returns CUDA source becomes a launchable kernel.

    @kjit.kernel
    def saxpy():
        return r'''extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {...}'''

    saxpy[blocks, threads](2.0, x, y, n)

Keyword defaults of the function are compile-time parameters: `scale.specialize(T="double")`
returns the kernel compiled with T="double", and `scale.precompile([{"T": "float"}, {"T": "double"}])`
compiles several at once, in parallel (kjit.compile_many). Compilation is lazy (first launch), once per
(parameters, device arch), and goes through kjit.compile's cache.

A launch runs on the device of its arrays; with none, on the device current in the launching
thread (kjit.Device, torch.cuda.device, cupy.cuda.Device). `f[grid, block]` picks the current
context's kernel, which hands a launch for another device to its twin there. Each device gets
the kernel on its first launch there: devices of one arch share one compile and one Module,
loaded into each device's context.
"""
from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Callable, Iterable, Mapping

from . import driver
from .compiler import CompileOptions
from .errors import ArgumentError, KjitError
from .runtime import torch_launch_entry, torch_visible_subscript


class _PyKernelFunctionBase:
    """f[config] in Python, where the C extension (its KernelFunctionBase) is not built."""

    __slots__ = ()

    @torch_launch_entry
    def __getitem__(self, config: Any) -> Callable[..., None]:
        return self._getitem_slow(config)  # type: ignore[attr-defined]


def _function_base() -> type:
    from .runtime import libcuda_function as c_function
    return c_function("KernelFunctionBase") or _PyKernelFunctionBase


# Every KernelFunction's context -> Kernel table, emptied for a context kjit destroys (a new
# context may get the same address).
_tables: "weakref.WeakSet[KernelFunction]" = weakref.WeakSet()


def _forget_context(ctx: int) -> None:
    # a new table, never changed in place: the C lookup remembers the last one's answer
    for f in list(_tables):
        if ctx in f._by_current:
            f._by_current = {c: k for c, k in f._by_current.items() if c != ctx}


driver.context_destroyed_hooks.append(_forget_context)


class KernelFunction(_function_base()):  # type: ignore[misc]
    """A kernel defined by a source-returning function; launch with `[grid, block](*args)`.

    `f[grid, block]` finds the Kernel for the thread's current context in `_by_current`
    (in C where the extension is built) and returns its launcher for that configuration."""

    def __init__(self, source_fn: Callable[..., str], *, name: str | None = None,
                 options: CompileOptions | None = None, arch: str | None = None,
                 jit_options: Any = None, params: dict[str, Any] | None = None):
        self.source_fn = source_fn
        self.options = options
        self.arch = arch
        self.jit_options = jit_options
        sig = inspect.signature(source_fn)
        self.defaults: dict[str, Any] = {}
        for p in sig.parameters.values():
            if p.default is inspect.Parameter.empty:
                raise KjitError(
                    f"@kjit.kernel function {source_fn.__name__}: parameter {p.name!r} needs a "
                    "default value (keyword defaults are the compile-time parameters)")
            self.defaults[p.name] = p.default
        self.params = dict(self.defaults, **(params or {}))
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ArgumentError(f"{source_fn.__name__} has no compile-time parameter(s) {sorted(unknown)}; "
                                f"it has {sorted(self.defaults)}")
        self.name = name or source_fn.__name__
        self._by_context: dict[tuple[int, int], Any] = {}   # (context, epoch) -> Kernel
        self._by_current: dict[int, Any] = {}   # context -> Kernel, for the fast path
        _tables.add(self)
        self._modules: dict[bytes, Any] = {}   # code -> Module, shared by the devices it suits
        self._current: Callable[[], int] | None = None   # cuCtxGetCurrent, resolved on first use
        self._lock = threading.Lock()
        self._specializations: dict[tuple, KernelFunction] = {}
        self._root: KernelFunction | None = None   # the decorated function it specializes
        self.object = None
        functools.update_wrapper(self, source_fn)

    def source(self) -> str:
        src = self.source_fn(**self.params)
        if not isinstance(src, str):
            raise KjitError(f"{self.source_fn.__name__}() must return the kernel source as a str, "
                            f"got {type(src).__name__}")
        return src

    def specialize(self, **params: Any) -> "KernelFunction":
        """This kernel with some compile-time parameters set (each specialization compiled once)."""
        key = tuple(sorted(dict(self.params, **params).items(), key=lambda kv: kv[0]))
        try:
            found = self._specializations.get(key)
        except TypeError:
            raise ArgumentError("compile-time parameter values must be hashable (str, int, float...)") from None
        if found is None:
            found = KernelFunction(self.source_fn, name=self.name, options=self.options,
                                   arch=self.arch, jit_options=self.jit_options,
                                   params=dict(self.params, **params))
            found._root = self._root or self
            self._specializations[key] = found
        return found

    def __reduce__(self) -> Any:
        """Pickled by reference, as functions are: the decorated module-level function by its
        name (every process compiles and loads it itself), a specialization as that function
        and its parameters."""
        if self._root is None:
            return self.__qualname__
        return (_specialized, (self._root, tuple(sorted(self.params.items()))))

    def compile(self, arch: str | None = None):
        """The ObjectCode for `arch` (default: the current device)."""
        from .compiler import compile as kjit_compile
        return kjit_compile(**self._compile_args(arch))

    def _compile_args(self, arch: str | None) -> dict[str, Any]:
        exprs = [self.name] if "<" in self.name else []
        return {"source": self.source(), "arch": arch or self.arch, "target": "cubin",
                "options": self.options, "name_expressions": exprs,
                "name": f"{self.source_fn.__name__}.cu"}

    def precompile(self, variants: Iterable[Mapping[str, Any]] = ({},), *,
                   arch: str | None = None, jobs: int | None = None) -> list["KernelFunction"]:
        """Compile many specializations at once and return them, in order: `variants` holds
        one dict of compile-time parameters each. Cache hits come at once; the misses compile
        in parallel worker processes (kjit.compile_many, `jobs` of them). A launch of each
        later finds its code in the cache. arch: default the current device."""
        from .compiler import compile_many
        if isinstance(variants, Mapping):
            raise ArgumentError("precompile takes a list of parameter dicts, e.g. [{'T': 'float'}]")
        fns = [self.specialize(**dict(v)) for v in variants]
        compile_many([f._compile_args(arch) for f in fns], jobs=jobs)
        return fns

    def kernel(self):
        """The loaded kjit.Kernel for the current context (compiled and loaded on first use)."""
        ctx = driver.ensure_context()
        key = (int(ctx), driver.context_epoch(ctx))
        k = self._by_context.get(key)
        if k is None:
            with self._lock:
                k = self._by_context.get(key)
                if k is None:
                    k = self._by_context[key] = self._load_here()
        return k

    def _load_here(self):
        from .runtime import load
        obj = self.compile()   # this device's arch: another device of the same arch is a cache hit
        self.object = obj
        module = self._modules.get(obj.code)
        if module is None:
            module = self._modules[obj.code] = load(obj, jit_options=self.jit_options)
        return module.get_function(self.name)   # loads the module into this context

    def _getitem_slow(self, config: Any) -> Callable[..., None]:
        # keyed by the thread's current context, so a device switch made by CuPy or PyTorch
        # (or kjit.Device) picks that device's kernel; one C call into libcuda
        current = self._current
        if current is None:
            from .runtime import current_context_fn
            current = self._current = current_context_fn()
        ctx = current()
        k = self._by_context.get((ctx, driver.context_epoch(ctx))) if ctx else None
        if k is None:
            k = self.kernel()
        if ctx and ctx == k.context_address:
            self._by_current = {**self._by_current, ctx: k}
        return k[config]

    @torch_launch_entry
    def launch(self, grid: Any, block: Any, *args: Any, **kwargs: Any) -> None:
        self.kernel().launch(grid, block, *args, **kwargs)

    def as_torch_op(self, name: str, *, grid: Any, block: Any, shared_mem: int = 0,
                    outputs: dict[str, Any] | None = None) -> Any:
        """This kernel as a PyTorch operator `name` ("mylib::saxpy"); see
        kjit.runtime.torch_op.as_torch_op. The operator launches, on each call, the kernel of
        the device current then (compiled and loaded there on first use)."""
        from .runtime import as_torch_op
        return as_torch_op(self, name, grid=grid, block=block, shared_mem=shared_mem,
                           outputs=outputs)

    def as_jax_op(self, *, grid: Any, block: Any, shared_mem: int = 0,
                  outputs: dict[str, Any] | None = None, ndim: dict[str, int] | None = None,
                  vmap: str = "sequential") -> Any:
        """This kernel as a JAX function (eager, jax.jit, jax.vmap); see
        kjit.runtime.jax_op.as_jax_op. Compiled (or found in the cache) and loaded in every GPU
        JAX has when a call is first traced."""
        from .runtime import as_jax_op
        return as_jax_op(self, grid=grid, block=block, shared_mem=shared_mem, outputs=outputs,
                         ndim=ndim, vmap=vmap)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise KjitError(f"launch {self.name} with a configuration: {self.name}[grid, block](*args)")

    def __repr__(self) -> str:
        return f"kjit.kernel({self.name}, params={self.params})"


if KernelFunction.__bases__[0] is not _PyKernelFunctionBase:
    def _compiled_getitem(self: KernelFunction, config: Any,
                          _lookup: Callable = KernelFunction.__bases__[0].__getitem__) -> Callable[..., None]:
        return _lookup(self, config)
    torch_visible_subscript(KernelFunction, _compiled_getitem)


def _specialized(root: KernelFunction, params: tuple) -> KernelFunction:
    return root.specialize(**dict(params))


def kernel(fn: Callable[..., str] | None = None, *, name: str | None = None,
           options: CompileOptions | None = None, arch: str | None = None,
           jit_options: Any = None) -> Any:
    """Decorate a function returning CUDA source; usable bare or with keyword options."""
    def wrap(f: Callable[..., str]) -> KernelFunction:
        return KernelFunction(f, name=name, options=options, arch=arch, jit_options=jit_options)
    return wrap(fn) if fn is not None else wrap
