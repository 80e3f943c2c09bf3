"""`@kjit.autotune(configs=[...], key=[...])` on a `@kjit.kernel`, and `kjit.autotune.tune`
for kernels built by hand.

    @kjit.autotune(configs=[Config({"BM": 128, "BN": 128}, block=256), ...], key=["M", "N", "K"],
                   grid=lambda m: (cdiv(m["N"], m["BN"]), cdiv(m["M"], m["BM"])))
    @kjit.kernel
    def sgemm(BM=64, BN=64): return f"#define BM {BM} ..."

    sgemm(A, B, C, M, N, K)     # grid, block and shared memory from the chosen config
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..errors import ArgumentError, KjitError
from .config import Config
from .timing import EARLY_MARGIN, SCREEN_MARGIN
from .tuner import Result, Timer, Tuner


class Autotuned:
    """A @kjit.kernel with a tuning space: call it with the kernel's arguments."""

    def __init__(self, function: Any, tuner: Tuner):
        self.function = function
        self.tuner = tuner
        self.__name__ = getattr(function, "__name__", "kernel")
        self.__doc__ = getattr(function, "__doc__", None)

    @property
    def configs(self) -> list[Config]:
        return self.tuner.configs

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        self.tuner.choose(args, kwargs, stream).launch(*args, stream=stream, **kwargs)

    def tune(self, *args: Any, stream: Any = None, **kwargs: Any) -> Result:
        """The Result for these arguments (tuning now if nothing is stored), without launching."""
        return self.tuner.choose(args, kwargs, stream)

    def best_config(self, *args: Any, **kwargs: Any) -> Config:
        return self.tune(*args, **kwargs).config

    def __getitem__(self, config: Any) -> Any:
        raise KjitError(f"{self.__name__} is autotuned: call it with the kernel's arguments, "
                        f"{self.__name__}(*args); the chosen configuration sets grid and block")

    def __repr__(self) -> str:
        return f"kjit.autotune({self.__name__}, {len(self.configs)} configs, key={self.tuner.key})"


def autotune(configs: Sequence[Config], key: Sequence[str] = (), *,
             block: Any = None, grid: Any = None, shared_mem: Any = None,
             restore_value: Sequence[str] = (), reset_to_zero: Sequence[str] = (),
             arg_names: Sequence[str] | None = None, warmup_ms: float = 25.0,
             rep_ms: float = 100.0, min_reps: int = 10, timer: Timer | None = None,
             device: Mapping[str, Any] | None = None, progress: bool | None = None,
             prune_configs_by: Any = None, search: Any = "exhaustive",
             early_stop: float | None = EARLY_MARGIN,
             screen: float | None = SCREEN_MARGIN) -> Callable[[Any], Autotuned]:
    """Decorate a @kjit.kernel with a tuning space; see docs/autotune.md.

    configs: kjit.autotune.Config values. key: the argument names whose values (numbers; for
    arrays, dtype and shape) select a tuning entry. block, grid, shared_mem: defaults for
    configs that leave them out (values, or functions of m: the named arguments and the
    config's params). restore_value / reset_to_zero: device arrays put back after each
    candidate / zeroed before each timed launch. arg_names: the kernel's parameter names when
    they cannot be read from its source. timer: replaces CUDA-event timing (a function of a
    candidate returning milliseconds: tests). device: the identity results are filed under
    (default: the current device's name, SM count, compute capability and driver).
    prune_configs_by: a function (or a list of them) of (configs, named arguments) returning
    the configs to keep for those arguments; pruned configs are never compiled.
    search: "exhaustive" (time every config), kjit.autotune.RandomSearch(budget), or an
    object with a search(candidates, records, measure) method (docs/autotune.md).
    early_stop: stop timing a candidate once at least 3 repeats have run and its fastest is
    over (1 + early_stop) times the best median so far; None times every repeat.
    screen: time each candidate briefly first (about 10 ms), then in full (warmup_ms, rep_ms)
    only those whose brief median is within (1 + screen) times the best; None times every
    candidate in full."""
    from ..decorator import KernelFunction

    def wrap(function: Any) -> Autotuned:
        if not isinstance(function, KernelFunction):
            raise ArgumentError("@kjit.autotune goes above @kjit.kernel (it tunes a kernel function); "
                                "for a Module or Kernel built by hand use kjit.autotune.tune(...)")
        unknown = sorted({p for c in configs if isinstance(c, Config) for p in c.params}
                         - set(function.defaults))
        if unknown:
            raise ArgumentError(f"configs set {unknown}, which {function.name} does not take: its "
                                f"compile-time parameters are {sorted(function.defaults)}")
        tuner = Tuner(configs, lambda c: function.specialize(**c.params), key=key,
                      arg_names=arg_names, restore_value=restore_value,
                      reset_to_zero=reset_to_zero, block=block, grid=grid, shared_mem=shared_mem,
                      warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, timer=timer,
                      device=device, arch=function.arch, progress=progress,
                      prune_configs_by=prune_configs_by, search=search, early_stop=early_stop,
                      screen=screen)
        return Autotuned(function, tuner)
    return wrap


def tune(candidates: Any, configs: Sequence[Config], args: Sequence[Any] = (), *,
         kwargs: Mapping[str, Any] | None = None, key: Sequence[str] = (), stream: Any = None,
         **options: Any) -> Result:
    """Tune kernels built by hand: `candidates` is a function of a Config returning a
    kjit.Kernel, a compile request {"source", "kernel", "options", "name_expressions"} or a
    @kjit.kernel function, or a list of those (one per config), or one @kjit.kernel (its
    specialisations with each config's params). Times them on `args` and
    returns the Result (`.config`, `.candidate.loaded()`, `.launch(*args)`); the choice is
    stored as for @kjit.autotune. `options`: as for autotune (block, grid, restore_value,
    prune_configs_by, search, early_stop, screen...)."""
    from ..decorator import KernelFunction
    if isinstance(candidates, KernelFunction):   # one @kjit.kernel: its specialisations
        function = candidates
        candidates = lambda c: function.specialize(**c.params)   # noqa: E731
    elif not callable(candidates):
        candidates = list(candidates)
        if len(candidates) != len(configs):
            raise ArgumentError(f"{len(candidates)} candidates for {len(configs)} configs: give one "
                                "per config, or a function of the config")
    tuner = Tuner(configs, candidates, key=key, **options)
    return tuner.choose(args, kwargs or {}, stream)
