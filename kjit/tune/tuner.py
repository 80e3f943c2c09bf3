"""The tuning itself: find each candidate's stored record, compile the missing ones in
parallel, skip those that fail or exceed the device's limits, time the rest, choose."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, Mapping, Sequence

from ..errors import ArgumentError, DriverError, KjitError
from .keys import current_device, key_values, name_args, parameter_names
from .store import Transient, get_or_measure, peek, record_key
from .candidates import Candidate, compile_candidates, limit_problem
from .config import Config, check_configs, mode

Timer = Callable[[Candidate], float]


class Result:
    """One tuning's outcome: the chosen candidate and every configuration's record."""

    def __init__(self, chosen: Candidate, candidates: list[Candidate], records: list[dict | None],
                 key: dict, measured: int, how: str, names: list[str] | None):
        self.candidate, self.candidates, self.records = chosen, candidates, records
        self.key, self.measured, self.mode, self._names = key, measured, how, names

    @property
    def index(self) -> int:
        return self.candidate.index

    @property
    def config(self) -> Config:
        return self.candidate.config

    @property
    def ms(self) -> float | None:
        rec = self.records[self.index]
        return rec.get("ms") if rec else None

    def launch(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        """Launch the chosen candidate with the geometry its configuration gives these args."""
        named = name_args(self._names, args, kwargs, self.candidate.name)
        ordered = list(named.values()) if self._names is None else [named[n] for n in self._names]
        grid, block, shared = self.candidate.geometry(named)
        self.candidate.launcher(grid, block, shared, stream)(*ordered)

    def table(self) -> list[dict[str, Any]]:
        return [{"index": c.index, "config": c.config.label(), **(r or {"status": "not timed"})}
                for c, r in zip(self.candidates, self.records)]

    def __repr__(self) -> str:
        ms = f", {self.ms:.4f} ms" if self.ms is not None else ""
        return f"kjit.autotune.Result({self.config.label()}{ms}, mode={self.mode})"


class Tuner:
    """Chooses among `configs`, each turned into a candidate by `make(config)` or `make[i]`
    (a @kjit.kernel specialisation, a compile request dict or a kjit.Kernel)."""

    def __init__(self, configs: Sequence[Config], make: Callable[[Config], Any] | list, *,
                 key: Sequence[str] = (), arg_names: Sequence[str] | None = None,
                 restore_value: Sequence[str] = (), reset_to_zero: Sequence[str] = (),
                 block: Any = None, grid: Any = None, shared_mem: Any = None,
                 warmup_ms: float = 25.0, rep_ms: float = 100.0, min_reps: int = 10,
                 timer: Timer | None = None, device: Mapping[str, Any] | None = None,
                 arch: str | None = None, progress: bool | None = None, label: str | None = None):
        self.configs = [c.with_defaults(block, grid, shared_mem) for c in check_configs(configs)]
        self.make = make
        for what, names in (("key", key), ("restore_value", restore_value),
                            ("reset_to_zero", reset_to_zero)):
            if isinstance(names, str) or any(not isinstance(n, str) for n in names):
                raise ArgumentError(f"{what} must be a list of argument names, got {names!r}")
        self.key, self.restore, self.zero = list(key), list(restore_value), list(reset_to_zero)
        self.arg_names = list(arg_names) if arg_names is not None else None
        self.bench_args = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "min_reps": min_reps}
        self.timer, self.device, self.arch = timer, dict(device) if device else None, arch
        self.progress, self.label = progress, label
        self._candidates: list[Candidate] | None = None
        self._chosen: dict[str, Result] = {}
        self._current: Callable[[], int] | None = None

    # --- candidates and names -----------------------------------------------------------
    def candidates(self) -> list[Candidate]:
        if self._candidates is None:
            make = self.make
            self._candidates = [Candidate(i, c, make[i] if isinstance(make, list) else make(c))
                                for i, c in enumerate(self.configs)]
            if self.arg_names is None:
                first = self._candidates[0]
                if first.source:
                    self.arg_names = parameter_names(first.source, first.name)
                elif first.kernel is not None:   # loaded by hand: the names it was typed with
                    self.arg_names = [p.name for p in first.kernel.params] or None
            if self.label is None:
                self.label = self._candidates[0].name
        return self._candidates

    def name(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        self.candidates()
        return name_args(self.arg_names, args, kwargs, self.label or "kernel")

    # --- choosing -----------------------------------------------------------------------
    def choose(self, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None,
               stream: Any = None) -> Result:
        """The Result for these arguments: remembered, else stored, else tuned now."""
        named = self.name(args, kwargs or {})
        kv = key_values(self.key, named)
        memo = json.dumps(kv, sort_keys=True)
        if self.device is None:   # a choice belongs to a device: the context current now
            if self._current is None:
                from ..runtime.libcuda import current_context_fn
                self._current = current_context_fn()
            memo += f"@{self._current()}"
        found = self._chosen.get(memo)
        if found is None:
            found = self._chosen[memo] = self._tune(named, kv, stream)
        return found

    def _tune(self, named: dict[str, Any], kv: dict, stream: Any) -> Result:
        cands = self.candidates()
        how, fixed = mode(len(cands))
        if how != "tune":
            return Result(cands[fixed], cands, [None] * len(cands), kv, 0, how, self.arg_names)
        device = self.device or current_device()
        rkeys = [record_key(c.name, c.source_sha, c.options_key(), c.exprs, device, kv,
                            c.config.describe()) for c in cands]
        records: list[dict | None] = [peek(k) for k in rkeys]
        missing = [c for c, r in zip(cands, records) if r is None]
        measured = 0
        if missing:
            self._compile(missing, device)
            ordered = list(named.values()) if self.arg_names is None else [named[n] for n in self.arg_names]
            if stream is None:   # timed where PyTorch's own work on these tensors runs
                stream = _torch_stream(ordered)
            protected = None
            if self.timer is None and (self.restore or self.zero):
                from .timing import Protected
                from ..runtime.stream import as_handle
                protected = Protected(named, self.restore, self.zero, as_handle(stream))
            with _progress(self.progress, len(missing), f"tuning {self.label}") as bar:
                for c in missing:
                    try:
                        rec, here = get_or_measure(
                            rkeys[c.index], f"{self.label} [{c.config.label()}]",
                            lambda c=c: self._measure(c, named, ordered, stream, protected))
                    except Transient as t:
                        rec, here = t.record, True
                    records[c.index] = rec
                    measured += here
                    bar.update(1)
        ok = [(r["ms"], i) for i, r in enumerate(records) if r and r.get("status") == "ok"]
        if not ok:
            reasons = "\n".join(f"  [{c.index}] {c.config.label()}: {(r or {}).get('reason', '?')}"
                                for c, r in zip(cands, records))
            raise KjitError(f"autotune {self.label}: no configuration can run for {kv}:\n{reasons}")
        best = min(ok)[1]
        return Result(cands[best], cands, records, kv, measured, how, self.arg_names)

    def _compile(self, missing: list[Candidate], device: dict) -> None:
        todo = [c for c in missing if c.compile_item() is not None and c.object is None and c.error is None]
        results = compile_candidates([c.compile_item() for c in todo], self.arch)
        for c, r in zip(todo, results):
            if isinstance(r, BaseException):
                c.error = r
            else:
                c.object = r

    def _measure(self, c: Candidate, named: dict, ordered: list, stream: Any,
                 protected: Any) -> dict[str, Any]:
        if c.error is not None:
            return {"status": "compile_error", "reason": _first_lines(c.error)}
        if self.timer is not None:
            return {"status": "ok", "ms": float(self.timer(c))}
        from .timing import bench
        from ..runtime.stream import as_handle
        try:
            grid, block, shared = c.geometry(named)
            problem = limit_problem(c.loaded(), block, shared)
            if problem:
                return {"status": "skipped", "reason": problem}
            launch = c.launcher(grid, block, shared, stream)
            handle = as_handle(stream)
            before = (lambda: protected.before_launch(handle)) if protected and protected.zero else None
            try:
                res = bench(lambda: launch(*ordered), stream=stream, before=before, **self.bench_args)
            finally:
                if protected:
                    protected.restore(handle)
        except (DriverError, ArgumentError) as exc:   # not kept: may be this run's arguments
            raise Transient({"status": "error", "reason": _first_lines(exc)}) from None
        return {"status": "ok", **res}


def _torch_stream(args: Sequence[Any]) -> Any:
    """PyTorch's current stream for the device of the first tensor among args, or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            return torch.cuda.current_stream(a.device).cuda_stream
    return None


def _first_lines(exc: BaseException, n: int = 6) -> str:
    """The reason kept for a failed candidate: the error's first line and its error lines."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    errors = [ln.strip() for ln in lines[1:] if "error" in ln.lower()][:4]
    return "\n".join([lines[0], *errors] if errors else lines[:n])


class _NoBar:
    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _progress(wanted: bool | None, n: int, label: str) -> Any:
    """A bar with an estimate on a terminal (stderr), only for more than one candidate."""
    if wanted is False or n < 2 or not (wanted or sys.stderr.isatty()):
        return _NoBar()
    import click
    return click.progressbar(length=n, label=label, file=sys.stderr, show_eta=True,
                             show_pos=True)
