"""A lookup that never creates: memory, the checked disk entry, then the signed shared tier
(what is found below is copied up). For small records kept beside compiled code: tuning
results. A hit counts as a use, as any hit does, so pruning keeps records still in use."""
from __future__ import annotations

from ..objectcode import ObjectCode
from . import core


def peek(h: str, namespace: str = "", label: str = "") -> ObjectCode | None:
    """The entry stored under hashed key `h`, or None; a damaged entry is dropped (and made
    again by the caller), an unreachable server backs off as for any request."""
    if not core.enabled_by_env():
        return None
    c = core.current()
    obj = c.memory.get(h)
    if obj is None and c.disk is not None:
        try:
            obj = core._read(c, c.disk, h, namespace, label)
        except core.Unavailable:
            obj = None
    if obj is not None:
        c.pending_hits[h] = c.pending_hits.get(h, 0) + 1
        c.memory.put(h, obj)
        return obj
    tier = core._tier()
    got = tier.fetch(h) if tier is not None else None
    if got is None:
        return None
    obj, meta = got
    if c.disk is not None:
        try:
            c.disk.put(h, obj, meta)
        except Exception:
            pass
    c.memory.put(h, obj)
    return obj
