"""Autotuning for kernels written as source: `kjit.autotune` (docs/autotune.md).

    @kjit.autotune(configs=[kjit.autotune.Config({"BM": 64}, block=256), ...], key=["M", "N"])
    @kjit.kernel
    def kern(BM=64): ...

Each configuration's timing is kept in kjit's cache per (kernel source, device, key values,
configuration); KJIT_AUTOTUNE=off (first configuration) or fixed:<index> turns timing off.
"""
from __future__ import annotations

from .api import Autotuned, autotune, tune
from .config import Config
from .search import Exhaustive, RandomSearch
from .store import clear as clear_records, groups as record_groups  # kjit tune ls / clear
from .tuner import Result, Tuner

# kjit.autotune is the decorator; the rest of the API hangs off it
autotune.Config = Config            # type: ignore[attr-defined]
autotune.tune = tune                # type: ignore[attr-defined]
autotune.Tuner = Tuner              # type: ignore[attr-defined]
autotune.Result = Result            # type: ignore[attr-defined]
autotune.Autotuned = Autotuned      # type: ignore[attr-defined]
autotune.Exhaustive = Exhaustive    # type: ignore[attr-defined]
autotune.RandomSearch = RandomSearch  # type: ignore[attr-defined]

__all__ = ["autotune", "tune", "Config", "Tuner", "Result", "Autotuned", "Exhaustive",
           "RandomSearch"]
