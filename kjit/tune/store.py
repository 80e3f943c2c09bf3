"""Tuning records in kjit's cache: one entry per (kernel source, device, key values, config).

Each configuration's timing is its own entry, so adding a configuration times only that one,
and a record made by one process (or, through the shared Redis tier, one node) is found by
every other. Records go through the same layers as compiled code (memory, the checked disk
entry, the signed shared tier, the per-key lock and cluster lease while one is being timed).
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..cache import key_hash, lookup
from ..cache.entry import CorruptEntry
from ..cache.lookup import peek as peek_entry
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


def _decode(obj: ObjectCode | None) -> dict[str, Any] | None:
    if obj is None or obj.kind != "json":
        return None
    try:
        rec = json.loads(obj.code)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("status"), str) else None


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
    obj = lookup.get_or_create(NAMESPACE, k, create, label=LABEL_PREFIX + label, meta=meta)
    rec = _decode(obj)
    if rec is None:
        raise RuntimeError(f"the cache returned an unreadable tuning record for {label}")
    return rec, bool(measured)


# --- `kjit tune` --------------------------------------------------------------------------
def entries(kernel: str | None = None) -> list[dict[str, Any]]:
    """Every tuning record on the local disk, with its key: kernel, device, key values,
    config and result."""
    from ..cache import admin
    out = []
    for meta in admin.ls(kernel=LABEL_PREFIX, sort="created", reverse=True):
        info = meta.get("autotune")
        if meta.get("namespace") != NAMESPACE or not isinstance(info, dict):
            continue
        if kernel and kernel not in str(info.get("kernel")):
            continue
        rec = _record_of(meta["key"])
        out.append({"entry": meta["key"], **info, "result": rec, "created": meta.get("created")})
    return out


def _record_of(h: str) -> dict[str, Any] | None:
    c = lookup.current()
    try:
        got = c.disk.get(h) if c.disk is not None else None
    except CorruptEntry:
        return None
    return _decode(got[0]) if got else None


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
    from ..cache import admin, shared
    keys = [e["entry"] for e in entries(kernel)]
    if not keys:
        return 0
    store = admin._writable(admin._disk(), "clear")
    store.delete_many(keys)
    c = lookup.current()
    for h in keys:
        c.memory.discard(h)
    tier = shared.active()
    if tier is not None and tier.usable():
        try:
            tier.backend.delete(keys)
        except Exception:
            pass
    return len(keys)
