"""The tuning itself, in named steps: prune (the user's prune_configs_by functions, before
anything compiles), records (what the cache holds), measure (compile in the background and
time, as the search strategy asks: measure.py), choose (the fastest record)."""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from ..errors import ArgumentError, KjitError
from .keys import current_device, key_values, name_args, parameter_names
from .store import peek, record_key
from .candidates import Candidate
from .config import Config, check_configs, mode
from .measure import Measurer
from .timing import EARLY_MARGIN, SCREEN_MARGIN
from .search import as_search, prune, prune_functions

Timer = Callable[[Candidate], float]


class Result:
    """One tuning's outcome: the chosen candidate and every configuration's record."""

    def __init__(self, chosen: Candidate, candidates: list[Candidate], records: list[dict | None],
                 key: dict, measured: int, how: str, names: list[str] | None,
                 pruned: Sequence[int] = ()):
        self.candidate, self.candidates, self.records = chosen, candidates, records
        self.key, self.measured, self.mode, self._names = key, measured, how, names
        self.pruned = list(pruned)   # indices prune_configs_by left out for these arguments

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
        gone = set(self.pruned)
        return [{"index": c.index, "config": c.config.label(),
                 **(r or {"status": "pruned" if c.index in gone else "not timed"})}
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
                 arch: str | None = None, progress: bool | None = None, label: str | None = None,
                 prune_configs_by: Any = None, search: Any = None,
                 early_stop: float | None = EARLY_MARGIN, screen: float | None = SCREEN_MARGIN):
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
        self.prune_by = prune_functions(prune_configs_by)
        self.search = as_search(search)
        off = early_stop is None or early_stop is False
        if not off and (isinstance(early_stop, bool) or not isinstance(early_stop, (int, float))
                        or not 0 <= early_stop < 100):
            raise ArgumentError(f"early_stop={early_stop!r}: give a margin (0.2: stop a candidate "
                                "whose fastest repeat is over 1.2x the best median), or None")
        self.early_stop = None if off else float(early_stop)
        if screen is not None and (isinstance(screen, bool) or not isinstance(screen, (int, float))
                                   or not 0 <= screen < 100):
            raise ArgumentError(f"screen={screen!r}: give a margin (0.05: time in full the "
                                "configurations whose brief timing is within 5% of the best), "
                                "or None to time every configuration in full")
        self.screen = None if screen is None else float(screen)
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
                from ..runtime import current_context_fn
                self._current = current_context_fn()
            memo += f"@{self._current()}"
        found = self._chosen.get(memo)
        if found is None:
            found = self._chosen[memo] = self._tune(named, kv, stream)
        return found

    def _tune(self, named: dict[str, Any], kv: dict, stream: Any) -> Result:
        """The steps, in order: prune, records, measure (as the search strategy asks), choose."""
        cands = self.candidates()
        how, fixed = mode(len(cands))
        if how != "tune":
            return Result(cands[fixed], cands, [None] * len(cands), kv, 0, how, self.arg_names)
        kept = self.prune(cands, named)
        device = self.device or current_device()
        rkeys = {c.index: record_key(c.name, c.source_sha, c.options_key(), c.exprs, device, kv,
                                     c.config.describe()) for c in kept}
        records = self.records(rkeys)
        measurer = Measurer(self, named, stream, rkeys, records)
        try:
            self.search.search(kept, dict(records), measurer.measure)
        finally:
            measurer.close()
        return self.pick(cands, kept, records, kv, measurer.measured, how)

    # --- the steps ----------------------------------------------------------------------
    def prune(self, cands: list[Candidate], named: dict[str, Any]) -> list[Candidate]:
        """The candidates the prune_configs_by functions keep for these arguments; nothing
        has compiled yet, so a pruned configuration costs nothing. (The device-limit checks
        need the compiled kernel: the measure step makes them.)"""
        if not self.prune_by:
            return list(cands)
        return [cands[i] for i in prune(self.prune_by, self.configs, named)]

    def records(self, rkeys: dict[int, dict]) -> dict[int, dict]:
        """{candidate index: stored record} for those the cache has (memory, disk, shared tier)."""
        found = {i: peek(k) for i, k in rkeys.items()}
        return {i: r for i, r in found.items() if r is not None}

    def pick(self, cands: list[Candidate], kept: list[Candidate], records: dict[int, dict],
             kv: dict, measured: int, how: str) -> Result:
        """The fastest of the kept candidates' records (stored and just measured)."""
        listed: list[dict | None] = [records.get(c.index) for c in cands]
        ok = [(records[c.index]["ms"], c.index) for c in kept
              if records.get(c.index, {}).get("status") == "ok"]
        if not ok:
            reasons = "\n".join(f"  [{c.index}] {c.config.label()}: "
                                 f"{(records.get(c.index) or {}).get('reason', 'not timed')}"
                                 for c in kept)
            raise KjitError(f"autotune {self.label}: no configuration can run for {kv}:\n{reasons}")
        best = min(ok)[1]
        pruned = sorted(set(range(len(cands))) - {c.index for c in kept})
        return Result(cands[best], cands, listed, kv, measured, how, self.arg_names, pruned)
