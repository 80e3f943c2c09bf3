"""The candidates of one tuning: what each compiles, how it loads and launches, and the
checks against the device's limits that skip one before it is timed.

A candidate is a `@kjit.kernel` specialisation, a compile request (a dict with "source",
"kernel" and optionally "options" and "name_expressions"), or a `kjit.Kernel` already loaded.
All compiles go through `compile_candidates`, the one place that calls the compiler."""
from __future__ import annotations

from typing import Any, Callable

from ..compiler import CompileOptions
from ..errors import ArgumentError
from ..hashing import sha256
from .config import Config


def compile_candidates(items: list[dict[str, Any]], arch: str | None, *,
                       on_result: Callable[[int, Any], Any] | None = None,
                       jobs: int | None = None) -> list[Any]:
    """ObjectCode or the exception, per item in order, compiled in parallel worker processes
    (kjit.compile_many); on_result(index, result) as each finishes."""
    if not items:
        return []
    from ..compiler import compile_many
    return compile_many(items, arch=arch, target="cubin", errors="return", progress=False,
                        on_result=on_result, jobs=jobs)


def merged_options(options: CompileOptions | None, defines: dict[str, str | None]) -> CompileOptions | None:
    if not defines:
        return options
    base = options or CompileOptions()
    return base.replace(defines=dict(dict(base.defines), **defines))


class Candidate:
    def __init__(self, index: int, config: Config, target: Any):
        from ..decorator import KernelFunction
        from ..runtime import Kernel
        self.index, self.config = index, config
        self.function = self.request = self.kernel = None
        self.object: Any = None
        self.error: BaseException | None = None
        if isinstance(target, KernelFunction):
            if config.defines:
                target = KernelFunction(target.source_fn, name=target.name,
                                        options=merged_options(target.options, config.defines),
                                        arch=target.arch, jit_options=target.jit_options,
                                        params=target.params)
            self.function = target
            self.name = target.name
            self.source = target.source()
            self.options = target.options
            self.exprs = [target.name] if "<" in target.name else []
        elif isinstance(target, dict):
            if not isinstance(target.get("source"), str) or not isinstance(target.get("kernel"), str):
                raise ArgumentError("a candidate request is a dict with 'source' (str) and 'kernel' "
                                    "(the kernel's name or name expression)")
            self.request = target
            self.name = target["kernel"]
            self.source = target["source"]
            self.options = merged_options(target.get("options"), config.defines)
            self.exprs = list(target.get("name_expressions") or ([self.name] if "<" in self.name else []))
        elif isinstance(target, Kernel):
            self.kernel = target
            self.name = target.name
            obj = getattr(target.module, "object", None)
            code = getattr(obj, "code", b"") or target.name.encode()
            self.source, self.options, self.exprs = None, None, []
            self.source_sha = sha256(code).hexdigest()
            return
        else:
            raise ArgumentError(f"a candidate must be a @kjit.kernel function, a compile request dict "
                                f"or a kjit.Kernel, got {type(target).__name__}")
        self.source_sha = sha256(self.source.encode()).hexdigest()

    def geometry(self, named: dict[str, Any]) -> tuple[Any, Any, int]:
        """(grid, block, shared_mem) for a launch with these named arguments."""
        return self.config.resolve(named, self.function.params if self.function is not None else None)

    def options_key(self) -> Any:
        return self.options.describe() if self.options is not None else None

    def compile_item(self) -> dict[str, Any] | None:
        if self.function is not None:
            f = self.function
            return {"source": self.source, "options": f.options, "name_expressions": self.exprs,
                    "name": f"{f.source_fn.__name__}.cu", **({"arch": f.arch} if f.arch else {})}
        if self.request is not None:
            return {"source": self.source, "options": self.options, "name_expressions": self.exprs,
                    "name": self.request.get("name") or f"{self.name.split('<')[0]}.cu"}
        return None

    def loaded(self) -> Any:
        """The kjit.Kernel of this candidate in the current context."""
        if self.kernel is None:
            if self.function is not None:
                self.kernel = self.function.kernel()
            else:
                from ..runtime import load
                obj = self.object
                if obj is None:
                    obj = compile_candidates([self.compile_item()], None)[0]
                    if isinstance(obj, BaseException):
                        raise obj
                self.kernel = load(obj).get_function(self.name)
        return self.kernel

    def launcher(self, grid: Any, block: Any, shared: int, stream: Any) -> Any:
        if self.function is not None:
            return self.function[grid, block, stream, shared]
        return self.loaded()[grid, block, stream, shared]


def threads(block: Any) -> int:
    dims = block if isinstance(block, (tuple, list)) else (block,)
    n = 1
    for d in dims:
        n *= int(d)
    return n


def limit_problem(kernel: Any, block: Any, shared: int) -> str | None:
    """Why this kernel cannot run with this block and dynamic shared memory, or None."""
    from ..runtime import Device
    a = kernel.attributes
    n = threads(block)
    regs = f"{a.num_regs} registers/thread, {a.shared_size_bytes} B static shared"
    if n > a.max_threads_per_block:
        return (f"block of {n} threads exceeds the kernel's limit of {a.max_threads_per_block} "
                f"({regs})")
    optin = Device(kernel.device).attribute("max_shared_memory_per_block_optin")
    if a.shared_size_bytes + shared > optin:
        return (f"{a.shared_size_bytes} B static + {shared} B dynamic shared memory exceeds the "
                f"device's {optin} B per block")
    if shared > 48 * 1024:
        kernel.set_max_dynamic_shared(shared)
    if kernel.max_active_blocks(n, shared) == 0:
        return f"occupancy 0: no block of {n} threads fits on a multiprocessor ({regs})"
    return None
