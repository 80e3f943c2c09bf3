"""Listener hooks: every lookup reports what happened and how long it took."""
# (no `from __future__ import annotations`: NamedTuples would then compile each field's
# annotation text, and a fresh process's first compile() costs ~1.5 ms of a ~20 ms disk hit)

from typing import Callable, NamedTuple

# event names
MEMORY_HIT = "memory_hit"   # served from this process's memory layer
DISK_HIT = "disk_hit"       # read and checked from disk (wait_s > 0: another process created it)
REMOTE_HIT = "remote_hit"   # read and checked from the shared tier, then kept on disk (wait_s:
                            # waiting for the local lock and for another node's compile)
MISS = "miss"               # created (compiled/linked) and stored
BYPASS = "bypass"           # caching off (cache=False, KJIT_CACHE=0): created, not stored
CORRUPT = "corrupt"         # a stored entry failed its checks and was dropped
UNAVAILABLE = "unavailable" # the disk store could not be used; memory only from now on


class CacheEvent(NamedTuple):
    """What one cache lookup did. Times in seconds: `lookup_s` from the call to the result
    (everything), `create_s` the compile/link itself, `wait_s` spent waiting for another
    process's lock on the same key."""

    event: str
    namespace: str
    key: str
    label: str = ""
    lookup_s: float = 0.0
    create_s: float = 0.0
    wait_s: float = 0.0
    size: int = 0
    detail: str = ""


Listener = Callable[[CacheEvent], None]
_listeners: list[Listener] = []


def add_listener(fn: Listener) -> Listener:
    """Call fn(CacheEvent) after every cache lookup; returns fn (usable as a decorator)."""
    if not callable(fn):
        from ..errors import InvalidOptionError
        raise InvalidOptionError("a cache listener must be callable with one CacheEvent")
    _listeners.append(fn)
    return fn


def remove_listener(fn: Listener) -> None:
    """Stop calling fn; no error if it was not registered."""
    try:
        _listeners.remove(fn)
    except ValueError:
        pass


def emit(event: CacheEvent) -> None:
    for fn in tuple(_listeners):
        try:
            fn(event)
        except Exception as exc:  # a broken listener must not break a compile
            import warnings
            warnings.warn(f"kjit cache listener {fn!r} raised {exc!r}", RuntimeWarning, stacklevel=3)


def active() -> bool:
    return bool(_listeners)
