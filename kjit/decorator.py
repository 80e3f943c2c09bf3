"""@kjit.kernel: a Python function that returns CUDA source becomes a launchable kernel.

    @kjit.kernel
    def saxpy():
        return r'''extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {...}'''

    saxpy[blocks, threads](2.0, x, y, n)

Keyword defaults of the function are compile-time parameters: `scale.specialize(T="double")`
returns the kernel compiled with T="double". Compilation is lazy (first launch), once per
(parameters, device arch), and goes through kjit.compile's cache.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from . import driver
from .compiler.options import CompileOptions
from .errors import ArgumentError, KjitError


class KernelFunction:
    """A kernel defined by a source-returning function; launch with `[grid, block](*args)`."""

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
        self._by_context: dict[tuple[int, int], Any] = {}
        self._get_current = lambda: driver.bindings().cuCtxGetCurrent()
        self._specializations: dict[tuple, KernelFunction] = {}
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
            self._specializations[key] = found
        return found

    def compile(self, arch: str | None = None):
        """The ObjectCode for `arch` (default: the current device)."""
        from .compiler.api import compile as kjit_compile
        exprs = [self.name] if "<" in self.name else []
        return kjit_compile(self.source(), arch=arch or self.arch, target="cubin",
                            options=self.options, name_expressions=exprs,
                            name=f"{self.source_fn.__name__}.cu")

    def kernel(self):
        """The loaded kjit.Kernel for the current context (compiled and loaded on first use)."""
        ctx = driver.ensure_context()
        key = (int(ctx), driver.context_epoch(ctx))
        k = self._by_context.get(key)
        if k is None:
            from .runtime.module import load
            obj = self.compile()
            self.object = obj
            k = load(obj, jit_options=self.jit_options).get_function(self.name)
            self._by_context[key] = k
        return k

    def __getitem__(self, config: Any) -> Callable[..., None]:
        # keyed by the thread's current context, so a device switch made by CuPy or PyTorch
        # (or kjit.Device) picks that device's kernel; one cheap driver call
        err, ctx = self._get_current()
        k = self._by_context.get((int(ctx), driver.context_epoch(ctx))) if not err else None
        if k is None:
            k = self.kernel()
        return k[config]

    def launch(self, grid: Any, block: Any, *args: Any, **kwargs: Any) -> None:
        self.kernel().launch(grid, block, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise KjitError(f"launch {self.name} with a configuration: {self.name}[grid, block](*args)")

    def __repr__(self) -> str:
        return f"kjit.kernel({self.name}, params={self.params})"


def kernel(fn: Callable[..., str] | None = None, *, name: str | None = None,
           options: CompileOptions | None = None, arch: str | None = None,
           jit_options: Any = None) -> Any:
    """Decorate a function returning CUDA source; usable bare or with keyword options."""
    def wrap(f: Callable[..., str]) -> KernelFunction:
        return KernelFunction(f, name=name, options=options, arch=arch, jit_options=jit_options)
    return wrap(fn) if fn is not None else wrap
