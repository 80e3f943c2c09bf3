"""kjit.compile through the cache: the exact key, memoised so an in-process repeat costs µs.

The key (namespace "compile") covers: the source, its name, every header it can read with
contents (kjit.compiler.includes), all options after normalisation, name expressions,
target, arch, backend, the compiler's identity and version, the environment variables that
change compilation (kjit.cache.key.KEY_ENV_VARS) and the cache schema version.

Deriving it costs a source hash and an include scan, so it is memoised by the call's
arguments; a memo is reused only while every header and searched directory stats the same
(kjit.compiler.includes.Resolution.still_valid).
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Iterable

from .core import bypass, enabled_by_env, lookup_hashed
from .key import KEY_ENV_VARS, compiler_identity, env_fingerprint, key_hash, sha256
from .store import CacheWarning
from ..objectcode import ObjectCode

NAMESPACE = "compile"
_MEMO_MAX = 4096


class _Memo:
    __slots__ = ("key", "resolution", "create", "label", "meta")

    def __init__(self, key: str, resolution: Any, create: Callable[[], ObjectCode], label: str,
                 meta: Callable[[], dict]):
        self.key, self.resolution, self.create, self.label, self.meta = key, resolution, create, label, meta


_memo: dict[tuple, _Memo] = {}
_option_fields: dict[type, tuple[str, ...]] = {}
_warned: set[str] = set()


def _options_sig(options: Any) -> Any:
    """A hashable picture of CompileOptions (its dicts are mutable, so copy them as tuples).
    TypeError for anything else: make_request then says what is wrong."""
    if options is None:
        return None
    names = _option_fields.get(type(options))
    if names is None:
        if not is_dataclass(options) or isinstance(options, type):
            raise TypeError("not CompileOptions")
        names = _option_fields[type(options)] = tuple(f.name for f in fields(options))
    out = []
    for f in names:
        v = getattr(options, f)
        if isinstance(v, dict):
            v = tuple(v.items())
        elif isinstance(v, list):
            v = tuple(v)
        out.append(v)
    return (type(options), tuple(out))


def compile_through_cache(source: str, *, arch: Any, target: str | None, options: Any,
                          name_expressions: Iterable[str], backend: str, name: str | None,
                          cache: bool) -> ObjectCode:
    t0 = time.perf_counter()
    from ..compiler import api
    if not cache or not enabled_by_env():
        req = api.make_request(source, arch=arch, target=target, options=options,
                               name_expressions=name_expressions, backend=backend, name=name)
        return bypass(NAMESPACE, lambda: api.compile_uncached(req), req.name)
    if not isinstance(name_expressions, tuple) and not isinstance(name_expressions, str):
        name_expressions = tuple(name_expressions)
    if arch is None:  # the current device (or $KJIT_ARCH): may differ from call to call
        from .. import arch as arch_mod
        arch = arch_mod.resolve(None, backend if backend in ("cuda", "hip") else "cuda").name
    env = os.environ
    env_sig = tuple(env.get(v) for v in KEY_ENV_VARS.get(backend, ()))
    try:
        sig: tuple | None = (source, arch, target, backend, name, name_expressions,
                             _options_sig(options), env_sig)
        hash(sig)
    except TypeError:  # something unhashable: validation below will say what
        sig = None
    memo = _memo.get(sig) if sig is not None else None
    if memo is not None and memo.resolution.still_valid():
        return lookup_hashed(memo.key, NAMESPACE, memo.create, label=memo.label, meta=memo.meta, t0=t0)

    req = api.make_request(source, arch=arch, target=target, options=options,
                           name_expressions=name_expressions, backend=backend, name=name)
    from ..compiler import includes
    opts = req.options
    try:
        res = includes.resolve(req.source, name=req.name, include_dirs=opts.include_dirs,
                               headers=opts.headers, defines=opts.defines, extra=opts.extra)
    except includes.UnresolvedInclude as exc:
        if str(exc) not in _warned:
            _warned.add(str(exc))
            warnings.warn(f"{req.name}: {exc}; compiling without the cache", CacheWarning, stacklevel=3)
        return bypass(NAMESPACE, lambda: api.compile_uncached(req), req.name)
    desc = describe(req, res)
    k = key_hash(NAMESPACE, desc)
    create = lambda: api.compile_uncached(req)  # noqa: E731
    meta = lambda: {"key": desc, "source": req.source}  # noqa: E731
    if sig is not None:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[sig] = _Memo(k, res, create, req.name, meta)
    return lookup_hashed(k, NAMESPACE, create, label=req.name, meta=meta, t0=t0)


def describe(req: Any, res: Any) -> dict[str, Any]:
    """The compile key's canonical description for a request and its include resolution."""
    return {
        "source_sha256": sha256(req.source), "name": req.name, "arch": req.arch,
        "target": req.target, "backend": req.backend, "options": req.options.describe(),
        "name_expressions": list(req.name_expressions), "compiler": compiler_identity(req.backend),
        "env": env_fingerprint(req.backend), **res.key(),
    }


def compile_key(source: str, **kwargs: Any) -> str:
    """The cache key kjit.compile would use for these arguments (for tools and tests)."""
    from ..compiler import api, includes
    req = api.make_request(source, **kwargs)
    opts = req.options
    res = includes.resolve(req.source, name=req.name, include_dirs=opts.include_dirs,
                           headers=opts.headers, defines=opts.defines, extra=opts.extra)
    return key_hash(NAMESPACE, describe(req, res))
