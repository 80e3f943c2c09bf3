"""What torch.compile sees of kjit: never kjit's internals.

TorchDynamo traces Python frames. Left to itself it would trace into a kernel launch's Python
path (argument conversion, driver calls) and stop on values it cannot model, crashing the
compile. So, without importing torch:

- kjit's package directory is added to Dynamo's skip list as soon as Dynamo is imported (an
  import hook waits for it): a kjit function met while tracing is a graph break and runs
  eagerly, and no kjit frame is ever compiled. Launchers are closures defined in kjit's
  modules (kjit/runtime/kernel.py), so the same rule covers them.
- Every launch entry point (`k[...]`, `f[...]`, `.launch`, a configured launcher) is marked
  the way `torch.compiler.disable(reason=...)` marks a function, so the graph break (or the
  fullgraph=True error) says what to do instead: make the kernel an operator
  (`kernel.as_torch_op`, kjit/runtime/torch_op.py), which Dynamo records in the graph.
  `k[...]` is a C lookup that Dynamo cannot read; once Dynamo is imported, the kernel classes
  get a Python `__getitem__` (marked so) in its place: one Python call more per `k[...]`, in
  that process only.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

REASON = (
    "a kjit kernel launch is opaque to torch.compile, so it runs eagerly after a graph break "
    "(and fullgraph=True refuses it). Make the kernel a PyTorch operator, which compiles with "
    "no graph break and under CUDA graphs: op = kernel.as_torch_op('mylib::name', grid=..., "
    "block=...), then call op(...) in the compiled function")

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TRACE_RULES = "torch._dynamo.trace_rules"


def launch_entry(fn: Callable) -> Callable:
    """Mark a launch entry point as torch.compiler.disable(reason=REASON) marks a function
    (attributes only: no torch import, no wrapper on the launch path)."""
    fn._torchdynamo_disable = True   # type: ignore[attr-defined]
    fn._torchdynamo_disable_msg = REASON   # type: ignore[attr-defined]
    return fn


_subscripts: list[tuple[type, Callable]] = []


def visible_subscript(cls: type, getitem: Callable) -> None:
    """Give `cls` the marked Python `getitem` as its `__getitem__` once Dynamo is imported."""
    _subscripts.append((cls, launch_entry(getitem)))
    if _TRACE_RULES in sys.modules:
        cls.__getitem__ = _subscripts[-1][1]   # type: ignore[method-assign]


def _skip_kjit(trace_rules: Any) -> None:
    for cls, getitem in _subscripts:
        cls.__getitem__ = getitem   # type: ignore[method-assign]
    add = getattr(trace_rules, "add", None)
    if add is None:   # a Dynamo without its skip list: the marks above still name the route
        return
    try:
        add(__name__.partition(".")[0])
        clear = getattr(trace_rules, "clear_lru_cache", None)
        if clear is not None:
            clear()
    except Exception:   # never let this break the user's import of torch._dynamo
        pass


class _Loader:
    """Runs the real loader of Dynamo's trace rules, then adds kjit to its skip list."""

    def __init__(self, loader: Any, hook: "_Hook"):
        self.loader, self.hook = loader, hook

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        if self.hook in sys.meta_path:   # its work is done (the import machinery is past it)
            sys.meta_path.remove(self.hook)
        self.loader.exec_module(module)
        _skip_kjit(module)


class _Hook:
    """A meta path finder that waits for Dynamo's trace rules to be imported."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TRACE_RULES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None


def install() -> None:
    """Have Dynamo skip kjit: now if it is imported, else when it is."""
    loaded = sys.modules.get(_TRACE_RULES)
    if loaded is not None:
        _skip_kjit(loaded)
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())


install()
