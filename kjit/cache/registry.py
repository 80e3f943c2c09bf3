"""Which class serves KJIT_REMOTE_CACHE: named outright, or found by the URL's scheme.

- KJIT_REMOTE_CACHE_BACKEND=package.module:Class names a kjit.cache.backend.RemoteTier
  subclass; the URL may then have any form, the class reads it (Triton's
  TRITON_REMOTE_CACHE_BACKEND works the same way).
- Otherwise the scheme decides: redis, rediss and unix are kjit's Redis backend; any other
  scheme is looked up in the entry-point group kjit.remote_backends, so an installed package
  can serve s3:// with no setting beyond the URL.

choose() runs when the settings are read and imports nothing (a wrong name is found before
the tier's client library loads); load() imports and checks the class when the tier is
opened, after the first local miss, before anything compiles. Both raise SettingError
naming the variable to fix.
"""
from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

from .backend import Lease, RemoteTier, TierError, Watch
from .entry import CorruptEntry
from ..settings import ENV_REMOTE_BACKEND as ENV_BACKEND, ENV_REMOTE_URL as ENV_URL
from ..settings import SettingError, shown

REDIS = "kjit.cache.redis_backend:RedisTier"
BUILTIN = {"redis": REDIS, "rediss": REDIS, "unix": REDIS}
GROUP = "kjit.remote_backends"
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_SPEC = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
REDIS_FORM = ("a Redis URL: redis://[user:password@]host:port/db, rediss://... for TLS, "
              "or unix:///path/to/socket")
_HOW = (f"to use another store, set {ENV_BACKEND}=package.module:Class naming a "
        f"kjit.cache.backend.RemoteTier subclass, or register its scheme in the entry-point "
        f"group {GROUP} (docs/cluster.md, \"Writing your own tier\")")


def redact(url: str) -> str:
    """The URL without its password, for messages and `kjit info`."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
    except ValueError:
        return "(a malformed URL)"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


@dataclass(frozen=True)
class Choice:
    spec: str       # "module:Class"
    where: str      # the setting that chose it, as an error message names it
    builtin: bool   # kjit's own Redis backend: trusted to raise only TierError


def choose(url: str, explicit: str | None) -> Choice:
    """The backend for `url`, or the one `explicit` (KJIT_REMOTE_CACHE_BACKEND) names;
    SettingError for a malformed name, an unknown scheme or a malformed Redis URL."""
    if explicit is not None:
        where = f"{ENV_BACKEND}={shown(explicit)}"
        if not _SPEC.fullmatch(explicit):
            raise SettingError(f"{where} is not package.module:Class (the module to import and "
                               "the kjit.cache.backend.RemoteTier subclass in it)")
        return Choice(explicit, where, explicit == REDIS)
    m = _SCHEME.match(url)
    scheme = m.group(1).lower() if m else ""
    if scheme in BUILTIN:
        _check_redis_url(url)
        return Choice(REDIS, f"{ENV_URL}={shown(redact(url))}", True)
    plugins = entry_points()
    if scheme in plugins:
        return Choice(plugins[scheme], f"{ENV_URL}={shown(redact(url))} (its scheme {scheme} is "
                                       f"{plugins[scheme]} in the entry-point group {GROUP})", False)
    installed = ", ".join(f"{s}://" for s in sorted(plugins))
    raise SettingError(f"{ENV_URL}={shown(url)} is not {REDIS_FORM}"
                       + (f", nor a URL of an installed backend ({installed})" if installed else "")
                       + f"; {_HOW}")


def _check_redis_url(url: str) -> None:
    """What redis-py would refuse, found without importing it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise SettingError(f"{ENV_URL}={shown(url)} is not {REDIS_FORM} ({exc})") from None
    if parts.scheme == "unix" and not parts.path:
        raise SettingError(f"{ENV_URL}={shown(url)} is not {REDIS_FORM} (no socket path)")


@functools.lru_cache(maxsize=1)
def entry_points() -> dict[str, str]:
    """Scheme -> "module:Class" from installed packages' kjit.remote_backends entry points
    (read once a process: installing a package does not change a running one). A scheme kjit
    serves itself is not taken over."""
    from importlib import metadata
    try:
        found = metadata.entry_points(group=GROUP)
    except Exception:  # a broken installed distribution must not break the cache
        return {}
    return {ep.name.lower(): ep.value.split("[")[0].strip() for ep in found
            if ep.name.lower() not in BUILTIN}


def load(choice: Choice) -> type[RemoteTier]:
    """The class `choice` names, imported and checked to implement the interface."""
    module_name, _, qualname = choice.spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        if choice.builtin:
            raise SettingError(f"{ENV_URL} is set but the Redis client is not installed ({exc}): "
                               "pip install 'kjit[redis]', or unset it") from None
        raise SettingError(f"{choice.where}: the module {module_name} cannot be imported ({exc}); "
                           "install the package that provides it, or correct the name") from None
    except Exception as exc:  # the module ran and failed: its own bug, reported as the setting's
        raise SettingError(f"{choice.where}: importing {module_name} failed "
                           f"({type(exc).__name__}: {exc})") from None
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise SettingError(f"{choice.where}: the module {module_name} has no {qualname}")
    _check_class(obj, choice)
    return obj


def _check_class(obj: Any, choice: Choice) -> None:
    if not isinstance(obj, type):
        raise SettingError(f"{choice.where} names a {type(obj).__name__}, not a class: name a "
                           "kjit.cache.backend.RemoteTier subclass")
    if not issubclass(obj, RemoteTier):
        lacks = sorted(m for m in RemoteTier.__abstractmethods__ if not callable(getattr(obj, m, None)))
        raise SettingError(f"{choice.where} names {obj.__qualname__}, which is not a "
                           "kjit.cache.backend.RemoteTier subclass: subclass it (it declares what "
                           "a backend implements, with defaults for the rest)"
                           + (f"; it also lacks {', '.join(lacks)}" if lacks else ""))
    missing = sorted(getattr(obj, "__abstractmethods__", ()))
    if missing:
        raise SettingError(f"{choice.where} names {obj.__qualname__}, which does not implement "
                           f"{', '.join(missing)} of kjit.cache.backend.RemoteTier")


def open_backend(choice: Choice, config: Any) -> RemoteTier:
    """The backend `choice` names, made from `config` (a kjit.cache.remote.RemoteConfig)."""
    cls = load(choice)
    try:
        backend = cls.from_config(config)
    except SettingError:
        raise
    except (ValueError, TypeError) as exc:  # the URL or a limit is not one it can use
        raise SettingError(f"{ENV_URL}={shown(config.display_url)} cannot be used by {choice.spec} "
                           f"({type(exc).__name__}: {exc})") from None
    except Exception as exc:   # a plug-in's own failure (no credentials...): said, not a traceback
        if choice.builtin:
            raise
        raise SettingError(f"{choice.where}: {choice.spec}.from_config failed "
                           f"({type(exc).__name__}: {exc})") from None
    if not isinstance(backend, RemoteTier):
        raise SettingError(f"{choice.where}: {choice.spec}.from_config returned a "
                           f"{type(backend).__name__}, not a kjit.cache.backend.RemoteTier")
    return backend if choice.builtin else Guarded(backend)


# --- a plug-in's faults are the tier's faults -------------------------------------------------
def _guard(what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (TierError, CorruptEntry):
        raise
    except Exception as exc:  # its client's own errors (botocore's, say): a fault, not a crash
        raise TierError(f"{what} raised {type(exc).__name__}: {exc}") from exc


class Guarded(RemoteTier):
    """A plug-in backend whose other exceptions are made TierErrors, so that kjit.cache.shared
    counts them and backs off, as for a Redis that went away, instead of failing a compile."""

    def __init__(self, inner: RemoteTier):
        self.inner = inner
        self.url = str(getattr(inner, "url", ""))
        self._name = type(inner).__name__

    def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        return _guard(f"{self._name}.{method}", lambda: getattr(self.inner, method)(*args, **kw))

    def get(self, key: str, ttl_s: float) -> bytes | None:
        return self._call("get", key, ttl_s)

    def put(self, key: str, value: bytes, ttl_s: float, *, overwrite: bool = True) -> bool:
        return self._call("put", key, value, ttl_s, overwrite=overwrite)

    def lease(self, key: str, ttl_s: float) -> Lease | None:
        got = self._call("lease", key, ttl_s)
        return None if got is None else _GuardedLease(got, f"{self._name} lease")

    def watch(self, key: str) -> Watch:
        return _GuardedWatch(self._call("watch", key), f"{self._name} watch")

    def lease_ttl(self, key: str) -> float | None:
        return self._call("lease_ttl", key)

    def expire_lease(self, key: str, ttl_s: float) -> bool:
        return self._call("expire_lease", key, ttl_s)

    def keys(self) -> Iterator[str]:  # listed whole, so that a fault mid-way is caught here
        return iter(_guard(f"{self._name}.keys", lambda: list(self.inner.keys())))

    def peek(self, keys: list[str], size: int) -> list[tuple[bytes | None, float | None]]:
        return self._call("peek", keys, size)

    def sizes(self, keys: list[str]) -> list[int]:
        return self._call("sizes", keys)

    def delete(self, keys: Iterable[str | bytes]) -> int:
        return self._call("delete", keys)

    def clear(self) -> int:
        return self._call("clear")

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        try:
            self.inner.close()
        except Exception:
            pass


class _GuardedLease(Lease):
    def __init__(self, inner: Lease, what: str):
        self.inner, self.what = inner, what

    def renew(self) -> bool:
        return _guard(self.what, self.inner.renew)

    def release(self) -> None:
        try:
            self.inner.release()
        except Exception:  # it lapses anyway
            pass


class _GuardedWatch(Watch):
    def __init__(self, inner: Watch, what: str):
        self.inner, self.what = inner, what

    def wait(self, timeout_s: float) -> bool:
        return _guard(self.what, lambda: self.inner.wait(timeout_s))

    def close(self) -> None:
        try:
            self.inner.close()
        except Exception:
            pass
