"""Tuning records in kjit's cache: one entry per (kernel source, device, key values, config).

Each configuration's timing is its own entry, so adding a configuration times only that one,
and a record made by one process (or, through the shared Redis tier, one node) is found by
every other. Records go through the same layers as compiled code (memory, the checked disk
entry, the signed shared tier, the per-key lock and cluster lease while one is being timed).
"""
from __future__ import annotations

import json
import math
import warnings
from typing import Any, Callable

from ..cache import get_or_create, key_hash, peek as peek_entry
from ..objectcode import ObjectCode

NAMESPACE = "autotune"
LABEL_PREFIX = "autotune:"
SCHEMA = 1


class Transient(Exception):
    """A measurement that must not be kept (a launch failed): carries its record."""

    def __init__(self, record: dict[str, Any]):
        super().__init__(record.get("reason", ""))
        self.record = record


def record_key(kernel: str, source_sha: str, options: Any, exprs: list[str], device: dict,
               key: dict, config: dict) -> dict[str, Any]:
    return {"schema": SCHEMA, "kernel": kernel, "source": source_sha, "options": options,
            "name_expressions": list(exprs), "device": device, "key": key, "config": config}


def hashed(k: dict[str, Any]) -> str:
    return key_hash(NAMESPACE, k)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def valid_record(rec: Any) -> bool:
    """Whether `rec` has the shape the tuner writes: a status; a time in ms for "ok"; the
    timing's other numbers and a reason text where present. A record from a shared tier
    or an archive is checked before the tuner or `kjit tune` uses a field of it."""
    if not isinstance(rec, dict) or not isinstance(rec.get("status"), str):
        return False
    if rec["status"] == "ok" and not _number(rec.get("ms")):
        return False
    if any(k in rec and not _number(rec[k]) for k in ("ms", "reps", "min_ms", "max_ms")):
        return False
    return not ("reason" in rec and not isinstance(rec["reason"], str))


def _decode(obj: ObjectCode | None) -> dict[str, Any] | None:
    if obj is None or obj.kind != "json":
        return None
    try:
        rec = json.loads(obj.code)
    except (ValueError, RecursionError):
        return None
    return rec if valid_record(rec) else None


def peek(k: dict[str, Any]) -> dict[str, Any] | None:
    """The stored record for k (memory, disk, then the shared tier), never creating one."""
    return _decode(peek_entry(hashed(k)))


def get_or_measure(k: dict[str, Any], label: str, measure: Callable[[], dict[str, Any]]
                   ) -> tuple[dict[str, Any], bool]:
    """(record, measured here): the stored record, else measure() stored under k (under the
    cache's lock and the cluster's lease, so two processes do not time one config twice)."""
    measured = []

    def create() -> ObjectCode:
        rec = measure()
        measured.append(True)
        return ObjectCode(json.dumps(rec, sort_keys=True).encode(), kind="json",
                          arch=None, name=label)

    meta = {"autotune": {k2: k[k2] for k2 in ("kernel", "device", "key", "config")}}
    obj = get_or_create(NAMESPACE, k, create, label=LABEL_PREFIX + label, meta=meta)
    rec = _decode(obj)
    if rec is None:
        # A stored record kjit did not write (a shared tier's, an archive's): never used;
        # this configuration is timed here, and `kjit tune clear` removes the record.
        warnings.warn(f"the cached tuning record for {label} is not one kjit writes: ignored and "
                      "timed again (`kjit tune clear` removes it)", RuntimeWarning, stacklevel=2)
        rec = measure()
        measured.append(True)
        if not valid_record(rec):
            raise RuntimeError(f"the tuner made a tuning record of the wrong shape for {label}: {rec!r}")
    return rec, bool(measured)


# --- `kjit tune` --------------------------------------------------------------------------
def _rows(kernel: str | None) -> list[dict[str, Any]]:
    """The metadata of every tuning entry on the local disk (of one kernel), whatever its shape."""
    out = []
    from ..cache import ls   # kjit cache's listing (and diskcache): `kjit tune` only
    for meta in ls(kernel=LABEL_PREFIX, sort="created", reverse=True):
        if meta.get("namespace") != NAMESPACE:
            continue
        info = meta.get("autotune")
        if kernel and kernel not in str(info.get("kernel") if isinstance(info, dict) else info):
            continue
        out.append(meta)
    return out


def _valid_info(info: Any) -> bool:
    """Whether a tuning entry's description has the shape record_key gives it."""
    return (isinstance(info, dict) and isinstance(info.get("kernel"), str)
            and all(isinstance(info.get(f), dict) for f in ("device", "key", "config")))


def entries(kernel: str | None = None) -> list[dict[str, Any]]:
    """Every tuning record on the local disk, with its key: kernel, device, key values,
    config and result (None where the result is not one kjit writes). Entries whose
    description kjit did not write are left out, with one warning."""
    out, odd = [], 0
    for meta in _rows(kernel):
        info = meta.get("autotune")
        if not _valid_info(info):
            odd += 1
            continue
        rec = _record_of(meta["key"])
        out.append({"entry": meta["key"], **{f: info[f] for f in ("kernel", "device", "key", "config")},
                    "result": rec, "created": meta.get("created")})
    if odd:
        warnings.warn(f"{odd} tuning record(s) in the cache are not of the shape kjit writes: not "
                      "listed (`kjit tune clear` removes them)", RuntimeWarning, stacklevel=2)
    return out


def _record_of(h: str) -> dict[str, Any] | None:
    from ..cache import read_local
    code = read_local(h)
    return _decode(code) if code is not None else None


def groups(kernel: str | None = None) -> list[dict[str, Any]]:
    """Records grouped by (kernel, device, key values), each with its best configuration."""
    by: dict[str, dict[str, Any]] = {}
    for e in entries(kernel):
        ident = json.dumps([e["kernel"], e["device"], e["key"]], sort_keys=True)
        g = by.setdefault(ident, {"kernel": e["kernel"], "device": e["device"], "key": e["key"],
                                  "configs": []})
        g["configs"].append({"config": e["config"], "result": e["result"], "entry": e["entry"]})
    out = []
    for g in by.values():
        timed = [c for c in g["configs"] if (c["result"] or {}).get("status") == "ok"]
        g["configs"].sort(key=lambda c: (c["result"] or {}).get("ms", float("inf")))
        best = min(timed, key=lambda c: c["result"]["ms"]) if timed else None
        g["best"] = best and {"config": best["config"], "ms": best["result"]["ms"]}
        g["id"] = key_hash(NAMESPACE, [g["kernel"], g["device"], g["key"]])[:12]
        out.append(g)
    out.sort(key=lambda g: (g["kernel"], g["id"]))
    return out


def clear(kernel: str | None = None) -> int:
    """Delete the tuning records (of one kernel); also from the shared tier when one is set."""
    keys = [meta["key"] for meta in _rows(kernel)]   # those of any shape
    from ..cache import delete
    return delete(keys, "clear") if keys else 0
