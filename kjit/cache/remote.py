"""The shared (remote) tier behind the local disk cache: its configuration, and opening it.

A backend (kjit.cache.backend.RemoteTier: the interface) stores bytes by key and hands out
compile leases. Redis is the one kjit ships (kjit.cache.redis_backend); others are chosen
by URL scheme or named as module:Class (kjit.cache.registry). kjit.cache.shared holds the
logic between the cache and a backend (signing, leases, faults and counters) and opens the
configured one (shared.active()).

Turned on by KJIT_REMOTE_CACHE=redis://[user:pass@]host:port/db (rediss:// for TLS; another
scheme for another backend) or by configure(url, ...), which sets the same variables so
that child processes (kjit build's workers, a launcher's ranks) inherit them. Nothing here
imports redis: a process without the variable, and a disk hit, never load it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from . import registry
from .registry import redact  # noqa: F401 (re-exported)
from .backend import (Lease, PollingWatch, RemoteTier, TierError, TierFull,  # noqa: F401
                      ValueTooLarge, Watch)  # (re-exported: this module was their home)
from .key import SCHEMA_VERSION
from ..settings import SettingError, env_duration, env_raw, env_size, env_switch, env_text

ENV_URL = registry.ENV_URL                     # KJIT_REMOTE_CACHE
ENV_BACKEND = registry.ENV_BACKEND             # KJIT_REMOTE_CACHE_BACKEND: package.module:Class
ENV_KEY = "KJIT_REMOTE_CACHE_KEY"              # HMAC-SHA256 secret (text)
ENV_KEY_FILE = "KJIT_REMOTE_CACHE_KEY_FILE"    # ... or a file holding it (kept out of `ps e`)
ENV_PREFIX = "KJIT_REMOTE_CACHE_PREFIX"
ENV_TTL = "KJIT_REMOTE_CACHE_TTL"              # since last use; 0 = no expiry
ENV_MAX_VALUE = "KJIT_REMOTE_CACHE_MAX_VALUE"  # larger values stay local only
ENV_TIMEOUT = "KJIT_REMOTE_CACHE_TIMEOUT"      # connect and read timeout per request
ENV_BACKOFF = "KJIT_REMOTE_CACHE_BACKOFF"      # first pause after a failure (doubles)
ENV_LEASE = "KJIT_REMOTE_CACHE_LEASE"          # a dead compiler's lease lapses after this
ENV_WAIT = "KJIT_REMOTE_CACHE_WAIT"            # longest wait for another node's compile
ENV_UNSIGNED = "KJIT_REMOTE_CACHE_UNSIGNED"    # 1: trust a shared server without a signing key
ENV_VARS = (ENV_URL, ENV_BACKEND, ENV_KEY, ENV_KEY_FILE, ENV_PREFIX, ENV_TTL, ENV_MAX_VALUE,
            ENV_TIMEOUT, ENV_BACKOFF, ENV_LEASE, ENV_WAIT, ENV_UNSIGNED)

DEFAULT_PREFIX = f"kjit:{SCHEMA_VERSION}:"
SCHEMES = tuple(registry.BUILTIN)
_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
# The longest each duration may be: beyond these a setting is a typo, and some overflow the
# socket and Redis expiry arithmetic.
_MAX_S = {"ttl_s": 10 * 365 * 86400.0, "timeout_s": 3600.0, "backoff_s": 86400.0,
          "lease_s": 86400.0, "wait_s": 7 * 86400.0}
_MAX_VALUE = 1 << 40


def _bad(name: str, value: Any, wanted: str):
    raise SettingError(f"{name}={value!r} is not {wanted}")


def _secret(env: Any) -> bytes | None:
    """The signing key the variables give; an empty or blank one is an error, never "none"."""
    secret: bytes | None = None
    text = env_raw(ENV_KEY, env)
    if text is not None:
        if not text.strip():
            _bad(ENV_KEY, text, f"a signing key: it is empty (unset it to use {ENV_KEY_FILE}, or "
                                f"to trust the server unsigned set {ENV_UNSIGNED}=1)")
        secret = text.encode("utf-8", "surrogateescape")
    path = env_raw(ENV_KEY_FILE, env)
    if path is not None:
        if not path.strip():
            _bad(ENV_KEY_FILE, path, "the path of a file holding the signing key")
        try:
            with open(path, "rb") as f:
                secret = f.read(1 << 20).strip()
        except OSError as exc:
            _bad(ENV_KEY_FILE, path, f"a readable file ({exc.strerror})")
        if not secret:
            _bad(ENV_KEY_FILE, path, "a file holding a signing key: the file is empty or blank")
    return secret


@dataclass(frozen=True)
class RemoteConfig:
    url: str
    secret: bytes | None = None
    prefix: str = DEFAULT_PREFIX
    ttl_s: float = 7 * 86400.0
    max_value: int = 64 << 20
    timeout_s: float = 2.0
    backoff_s: float = 5.0
    lease_s: float = 15.0
    wait_s: float = 600.0
    unsigned_ok: bool = False  # KJIT_REMOTE_CACHE_UNSIGNED=1: no key, and that is meant
    backend: registry.Choice | None = None  # None: by the URL's scheme

    @property
    def display_url(self) -> str:
        return redact(self.url)

    @property
    def refusal(self) -> str | None:
        """Why this configuration leaves the tier off (no signing key, and trusting the server
        unsigned was not asked for), or None when it may be used."""
        if self.secret is not None or self.unsigned_ok:
            return None
        return (f"{ENV_URL} is set but no signing key is: without one, anything that can write to "
                f"{self.display_url} can make this node run its code. Set {ENV_KEY_FILE} (or "
                f"{ENV_KEY}) to the cluster's key, or {ENV_UNSIGNED}=1 to trust the server "
                f"unsigned; the remote cache is off until then")

    @classmethod
    def from_env(cls, env: Any = None) -> "RemoteConfig | None":
        """The configuration the variables describe (os.environ's, or `env`'s), None if
        KJIT_REMOTE_CACHE is unset or empty; InvalidOptionError names a variable that is
        malformed."""
        url = env_text(ENV_URL, env)
        if url is None:
            return None
        backend = registry.choose(url, env_text(ENV_BACKEND, env))
        secret = _secret(env)
        unsigned = env_switch(ENV_UNSIGNED, env=env)
        prefix = env_raw(ENV_PREFIX, env) or DEFAULT_PREFIX
        if not _PREFIX_RE.fullmatch(prefix):
            _bad(ENV_PREFIX, prefix, "a key prefix of letters, digits and _ . : / -")
        kw: dict[str, Any] = {}
        for field, var in (("ttl_s", ENV_TTL), ("timeout_s", ENV_TIMEOUT), ("backoff_s", ENV_BACKOFF),
                           ("lease_s", ENV_LEASE), ("wait_s", ENV_WAIT)):
            kw[field] = env_duration(var, getattr(cls, field), most=_MAX_S[field],
                                     above_zero=field in ("timeout_s", "lease_s"), env=env)
        kw["max_value"] = env_size(ENV_MAX_VALUE, cls.max_value, env=env)
        if kw["max_value"] > _MAX_VALUE:
            _bad(ENV_MAX_VALUE, env_text(ENV_MAX_VALUE, env), "a size of at most 1T")
        return cls(url=url, secret=secret, prefix=prefix, unsigned_ok=unsigned, backend=backend, **kw)


def open_tier(config: RemoteConfig) -> RemoteTier:
    """The backend for config (imports its module, and its client library, now); SettingError
    naming the variable where that module or class cannot be used."""
    return registry.open_backend(config.backend or registry.choose(config.url, None), config)


def configure(url: str | None, *, key: str | bytes | None = None, prefix: str | None = None,
              ttl: str | float | None = None, max_value: str | int | None = None,
              timeout: str | float | None = None, backoff: str | float | None = None,
              lease: str | float | None = None, wait: str | float | None = None,
              unsigned: bool = False, backend: str | None = None) -> RemoteConfig | None:
    """Use the shared tier at `url` from now on (None: stop using one). Sets the
    KJIT_REMOTE_CACHE* variables, so processes started later inherit the setting; the
    arguments left out are unset. Without `key`, the tier is used only with unsigned=True
    (trust the server: see docs/security.md). `backend` ("package.module:Class") names the
    class that serves `url`, else its scheme decides (docs/cluster.md, "Writing your own
    tier"); a plug-in class is imported and checked here. Returns the checked configuration."""
    values = {ENV_URL: url, ENV_BACKEND: backend, ENV_KEY: key.decode() if isinstance(key, bytes) else key,
              ENV_PREFIX: prefix, ENV_TTL: ttl, ENV_MAX_VALUE: max_value, ENV_TIMEOUT: timeout,
              ENV_BACKOFF: backoff, ENV_LEASE: lease, ENV_WAIT: wait, ENV_KEY_FILE: None,
              ENV_UNSIGNED: "1" if unsigned else None}
    if url is None:
        values = dict.fromkeys(values)
    trial = {k: str(v) for k, v in values.items() if v is not None}
    config = RemoteConfig.from_env(trial)  # raises before anything changes
    if config is not None and config.backend is not None and not config.backend.builtin:
        registry.load(config.backend)      # a plug-in's name, checked now (Redis loads on use)
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    return config
