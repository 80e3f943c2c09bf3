"""A lookup that never creates: memory, the checked disk entry, then the signed shared tier
(what is found below is copied up). For small records kept beside compiled code: tuning
results, the manifests that let another install or node key a compile without compiling."""
from __future__ import annotations

from ..objectcode import ObjectCode
from . import core
from .entry import CorruptEntry


def peek(h: str) -> ObjectCode | None:
    """The entry stored under hashed key `h`, or None; never raises for a damaged entry or an
    unreachable server (a caller then makes the value itself)."""
    if not core.enabled_by_env():
        return None
    c = core.current()
    obj = c.memory.get(h)
    if obj is None and c.disk is not None:
        try:
            got = c.disk.get(h)
        except CorruptEntry:
            got = None   # get_or_create drops and replaces it when the value is made again
        except Exception:
            got = None
        obj = got[0] if got else None
        if obj is not None:
            c.memory.put(h, obj)
    if obj is None:
        obj = _shared(c, h)
    return obj


def _shared(c, h: str) -> ObjectCode | None:
    from . import entry, shared, signing
    tier = shared.active()
    if tier is None or not tier.usable():
        return None
    try:
        value = tier.backend.get(h, tier.config.ttl_s)
        if value is None or value.startswith(shared.NO_VALUE):
            return None
        header, code = entry.decode_header(signing.open_value(tier.config.secret, h, value), h)
        obj = ObjectCode(code, kind=header["kind"], arch=header.get("arch"), name=header.get("name", ""))
    except Exception:   # unsigned, damaged, or the server is down: the caller makes it
        return None
    if c.disk is not None:
        try:
            c.disk.put(h, obj, header.get("meta") or {})
        except Exception:
            pass
    c.memory.put(h, obj)
    return obj
