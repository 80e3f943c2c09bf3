"""Which configurations a tuning times: the user's pruning before anything compiles, and the
search strategy that decides what to measure and when to stop (docs/autotune.md).

A search strategy is an object with one method,

    search(candidates, records, measure) -> None

`candidates`: the configurations left after pruning (each has `.index` into the configs
list and `.config`); `records`: {index: record} of those already stored (a record is a dict
with "status" and, when "ok", "ms"); `measure(batch)`: compiles the batch in the background
and times each candidate as it is ready, returning their records in the batch's order (a
stored one is returned as it is, never timed again). The strategy calls `measure` as often
as it likes and returns when it is done; the tuner then chooses the fastest of every record
it has. A plain function of (candidates, records, measure) works too.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Mapping, Sequence

from ..errors import ArgumentError
from .config import Config

Measure = Callable[[Sequence[Any]], list]


class Exhaustive:
    """Time every configuration (the default): all compile together, each is timed as soon
    as it has compiled."""

    name = "exhaustive"

    def search(self, candidates: Sequence[Any], records: Mapping[int, dict], measure: Measure) -> None:
        measure(candidates)

    def __repr__(self) -> str:
        return "Exhaustive()"


class RandomSearch:
    """Time `budget` configurations drawn at random (the same ones every run for a seed),
    then more one at a time only while none of those measured can run. Stored records
    count as known and are never drawn: for large spaces where timing them all costs more
    than the last few percent are worth."""

    name = "random"

    def __init__(self, budget: int, seed: int = 0):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ArgumentError(f"RandomSearch(budget={budget!r}): give how many configurations "
                                "to time, a whole number, at least 1")
        self.budget, self.seed = budget, seed

    def search(self, candidates: Sequence[Any], records: Mapping[int, dict], measure: Measure) -> None:
        unknown = [c for c in candidates if c.index not in records]
        order = random.Random(self.seed).sample(unknown, len(unknown))
        got = list(records.values()) + measure(order[:self.budget])
        rest = order[self.budget:]
        while rest and not any(r and r.get("status") == "ok" for r in got):
            got += measure([rest.pop(0)])   # none of the draw runs: one more at a time

    def __repr__(self) -> str:
        return f"RandomSearch(budget={self.budget}, seed={self.seed})"


class _Function:
    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.name = fn, getattr(fn, "__qualname__", "search function")

    def search(self, candidates: Sequence[Any], records: Mapping[int, dict], measure: Measure) -> None:
        self.fn(candidates, records, measure)

    def __repr__(self) -> str:
        return f"<search {self.name}>"


STRATEGIES = {"exhaustive": Exhaustive}


def as_search(value: Any) -> Any:
    """The strategy object for autotune(search=...): None or a name, an object with a
    search method, or a function of (candidates, records, measure)."""
    if value is None:
        return Exhaustive()
    if isinstance(value, str):
        if value not in STRATEGIES:
            raise ArgumentError(f"search={value!r} is not a strategy kjit knows ({', '.join(STRATEGIES)}); "
                                "pass kjit.autotune.RandomSearch(budget) or an object with a "
                                "search(candidates, records, measure) method")
        return STRATEGIES[value]()
    if callable(getattr(value, "search", None)):
        return value
    if callable(value) and not isinstance(value, type):
        return _Function(value)
    raise ArgumentError(f"search must be 'exhaustive', kjit.autotune.RandomSearch(budget), or an object "
                        f"with a search(candidates, records, measure) method; got {value!r}")


# --- pruning ---------------------------------------------------------------------------
def prune_functions(value: Any) -> list[Callable[..., Any]]:
    """autotune(prune_configs_by=...): None, a function, or a list of functions."""
    if value is None:
        return []
    fns = list(value) if isinstance(value, (list, tuple)) else [value]
    for f in fns:
        if not callable(f):
            raise ArgumentError("prune_configs_by takes a function of (configs, named arguments) "
                                f"returning the configs to keep, or a list of them; got {f!r}")
    return fns


def prune(functions: Sequence[Callable[..., Any]], configs: list[Config],
          named: Mapping[str, Any]) -> list[int]:
    """Positions in `configs` of those every function keeps, in configs order. Each function
    gets the configs still kept and the launch's arguments by name, and returns some of them."""
    kept = list(range(len(configs)))
    for fn in functions:
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            out = fn([configs[i] for i in kept], dict(named))
        except ArgumentError:
            raise
        except Exception as exc:
            raise ArgumentError(f"prune_configs_by function {name} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        if isinstance(out, Config) or not isinstance(out, (list, tuple)):
            raise ArgumentError(f"prune_configs_by function {name} returned {type(out).__name__}: it "
                                "must return a list of the Configs it was given (those to keep)")
        where = {configs[i]: i for i in kept}
        chosen = set()
        for j, c in enumerate(out):
            if not isinstance(c, Config):
                raise ArgumentError(f"prune_configs_by function {name} returned a {type(c).__name__} "
                                    f"at position {j}: it must return Configs it was given")
            if c not in where:
                raise ArgumentError(f"prune_configs_by function {name} returned {c!r}, which is not "
                                    "one of the configs it was given (return a subset, not new ones)")
            chosen.add(where[c])
        if not chosen:
            raise ArgumentError(f"prune_configs_by function {name} kept no configuration for "
                                f"these arguments: keep at least one")
        kept = [i for i in kept if i in chosen]
    return kept
