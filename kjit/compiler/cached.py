"""kjit.compile: the request, its key, and the cache's lookup of that key, whose create is
the compile (compile_uncached, the one function that runs a compiler for a request).

The key (compiler/keys/) covers everything that can change the output, including every file
the compiler read, observed rather than guessed. Known from a manifest (the Snapshot of what
an earlier compile read, still holding), the lookup compiles only on a miss; on a manifest
miss the key is pending (keys/derive.py): the lookup's create is the compile, observed, and
the key is finished from what it read before the result is stored under it. In process the
key is memoised by the call's arguments and trusted while change notification
(keys/watch.py) reports nothing. A result whose inputs changed while it was compiled is
returned, never stored. Where the compiler cannot be observed (the C extension is not built,
KJIT_OBSERVE=0), a compile that could read a header is not cached (said once per process);
one that cannot is keyed by the request alone.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
import warnings
from functools import partial
from typing import Any, Callable, Iterable

from .. import arch as arch_mod
from ..cache import CacheWarning, bypass, creation_lock, enabled_by_env, lookup_hashed
from ..errors import InvalidOptionError
from ..objectcode import ObjectCode
from . import include_path
from .keys.derive import CompileKey, derive_key, scanned_key
from .keys.description import (ENV_WATCHED, NAMESPACE, Described, HeadersChanged, NotKeyed,
                               Observed, UnresolvedInclude)
from .keys.description import env_get as _env_get, watch_env
from .options import CompileOptions, leaks_state
from .request import BACKENDS, CompileRequest, make_request

__all__ = ["compile", "compile_key", "compile_uncached", "before_compile", "make_request",
           "CompileRequest", "BACKENDS"]

_RETRIES = 3
_MEMO_MAX = 4096
STAT_CHECKS_BEFORE_WATCHING = 1

# Called as a compile is about to run, before the compiler loads (compile_uncached): what it
# raises ends the compile and reaches kjit.compile's caller. A caller that wants only the
# cache's answer sets one that raises (compile_many, whose workers compile the misses).
before_compile: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "kjit_before_compile", default=None)

# set by compiler/worker.py in a worker started for one compile: it may use such flags
_ONE_COMPILE_WORKER = [False]


def _compile_isolated(source, arch, target, options, name_expressions, name, cache,
                      _request) -> ObjectCode:
    """kjit.compile in a worker process of its own, for flags NVRTC would carry into this
    process's later compiles (options.leaks_state); keys, cache and errors as here."""
    from .pool import compile_isolated, from_reply, request_line
    req = _request or make_request(source, arch=arch, target=target, options=options,
                                   name_expressions=name_expressions, backend="cuda", name=name)
    result = from_reply(compile_isolated(request_line(req, cache)), req)
    if isinstance(result, BaseException):
        raise result
    return result


def compile(source: str, *, arch=None, target: str | None = None,
            options: CompileOptions | None = None, name_expressions: Iterable[str] = (),
            backend: str = "cuda", name: str | None = None, cache: bool = True,
            _request: CompileRequest | None = None) -> ObjectCode:
    """Compile CUDA (NVRTC) or HIP (hiprtc) source to PTX, cubin, LTO-IR or an AMD code object.

    arch: "sm_90", "compute_90", "gfx90a", a kjit.Arch...; None means the current device,
    else $KJIT_ARCH.
    target: "cubin" (default for CUDA), "ptx", "ltoir"; "hsaco" for HIP.
    Raises InvalidOptionError for bad arguments and CompileError (with log and source
    excerpts) when the compiler rejects the source.
    _request: kjit's own callers' make_request of these same arguments (compile_many's items,
    validated before any compiles), so it is not made again; taken here rather than by a
    second entry point, which would put a frame between kjit.compile and the compiler.
    """
    t0 = time.perf_counter()
    if backend not in BACKENDS:  # before the arch, which is resolved for a backend
        raise InvalidOptionError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "cuda" and isinstance(options, CompileOptions) and options.extra and \
            leaks_state(options.extra) and not _ONE_COMPILE_WORKER[0]:
        return _compile_isolated(source, arch, target, options, name_expressions, name, cache,
                                 _request)
    if not cache or not enabled_by_env():
        req = _request or make_request(source, arch=arch, target=target, options=options,
                                       name_expressions=name_expressions, backend=backend,
                                       name=name)
        path = include_path.for_options(req.options, req.backend)
        if req.sources_dir is not None:
            _keep(req)
        return bypass(NAMESPACE, partial(compile_uncached, req, path), req.name)
    if arch is None:  # the current device (or $KJIT_ARCH): may differ from call to call
        arch = arch_mod.resolve(None, backend)   # an Arch: make_request takes it as it is
    if not isinstance(name_expressions, (tuple, str)):
        name_expressions = tuple(name_expressions)
    # A call seen before: its key, while the headers it was derived from hold.
    sig = _signature(source, arch, target, backend, name, name_expressions, options)
    memo = _memo.get(sig) if sig is not None else None
    if memo is not None and memo.valid():
        if memo.kept is not None:   # its binary names kept files: there, also after a prune
            _keep(memo.kept.req, memo.kept)
        try:
            return lookup_hashed(memo.key, NAMESPACE, memo.create, label=memo.label, meta=memo.meta,
                                 t0=t0, check=memo.check)
        except HeadersChanged:  # its entry was gone, and a compile now reads other files
            _memo.pop(sig, None)

    req = _request or make_request(source, arch=arch, target=target, options=options,
                                   name_expressions=name_expressions, backend=backend, name=name)
    path = include_path.for_options(req.options, req.backend)
    if req.sources_dir is not None:   # before compiling: a hit's binary names them too
        _keep(req)
    for _ in range(_RETRIES):
        try:
            # known from a manifest; on a manifest miss pending, as it names what the compile reads
            key = derive_key(req, path)
            if key.pending:
                _before_the_lock(req)
            # the lookup's create is the compile: for a pending key it runs first, under the
            # manifest's lock, and the key is finished from what it read
            obj = lookup_hashed(key, NAMESPACE, partial(compile_uncached, req, path, key.job),
                                label=req.name, meta=key.job.meta, t0=t0, check=key.check)
        except UnresolvedInclude as exc:
            # NotKeyed says once for the process what to do; a computed include, per kernel
            _warn_once(str(exc) if isinstance(exc, NotKeyed)
                       else f"{req.name}: {exc}; compiling without the cache")
            if getattr(exc, "compiled", None) is not None:
                return exc.compiled.with_(cache_hit=None)
            return bypass(NAMESPACE, partial(compile_uncached, req, path), req.name)
        except HeadersChanged:   # a header changed between keying and compiling: keyed again
            continue
        if sig is not None and key.key is not None:
            _remember(sig, key, req)
        return obj
    return bypass(NAMESPACE, partial(compile_uncached, req, path), req.name)


def _before_the_lock(req: CompileRequest) -> None:
    """Before a manifest miss's compile, which runs under the manifest's lock: that lock's
    holder opens the cache databases on a helper thread, so the compile's modules load now
    and the thread's Python then runs beside NVRTC, not beside these imports."""
    from importlib import import_module
    import_module(".keys.portable", __package__)
    import_module(".keys.snapshot", __package__)
    if req.backend == "cuda":
        import_module(".nvrtc", __package__)
        if before_compile.get() is None:   # (a hook may hand the compile to another process)
            # NVRTC's first compile calls cuInit where a driver is installed: started now,
            # it overlaps cuda.bindings' import and NVRTC's load instead
            from .. import driver
            driver.start_init(context=False)


def compile_key(source: str, **kwargs: Any) -> str:
    """The cache key kjit.compile would use for these arguments (for tools and tests). Where
    compiles are observed it is known only from a manifest or by compiling: a compile runs
    when no manifest holds it (its manifest is kept, its binary is not). A source that does
    not compile has no observed key: its scanned one is returned."""
    from ..errors import CompileError
    from .keys.snapshot import timestamp_granularity
    req = make_request(source, **kwargs)
    path = include_path.for_options(req.options, req.backend)
    for _ in range(_RETRIES):
        key = derive_key(req, path)
        if not key.pending:
            return key.key
        try:
            with creation_lock(key.lock):   # as kjit.compile's lookup, storing no binary
                if key.settle() is None:
                    key.finish(compile_uncached(req, path, key.job))
        except CompileError:
            break
        finally:
            key.close(False)
        if key.key is not None:
            return key.key
        time.sleep(timestamp_granularity())  # a header changed as it compiled: again
    return scanned_key(Described(req, path))


def compile_uncached(req: CompileRequest, path: include_path.SearchPath | None = None,
                     job: Described | None = None) -> ObjectCode:
    """Run the compiler for a validated request, searching includes along `path` (default:
    the request's include_path.for_options); `job`: the request's key descriptions, whose
    options description the metadata reuses; an Observed one records what the compiler read.
    The compiler's modules (and the regexes declarations are scanned with) load only here."""
    hook = before_compile.get()
    if hook is not None:
        hook()
    from . import declarations
    from .keys.identity import compiler_version
    if path is None:
        path = include_path.for_options(req.options, req.backend)
    recording: Any = contextlib.nullcontext([])
    if isinstance(job, Observed):
        from .keys import observe
        job.started, recording = time.time(), observe.collecting()
    with recording as seen:
        if req.backend == "hip":
            from . import hiprtc
            code, log, symbols, ms = hiprtc.compile_source(
                req.source, name=req.name, arch=req.arch, target=req.target, options=req.options,
                name_expressions=req.name_expressions, headers=path.headers)
        else:
            from . import nvrtc
            code, log, symbols, ms = nvrtc.compile_source(
                req.source, name=req.name, arch=req.arch, target=req.target, options=req.options,
                name_expressions=req.name_expressions, search=path, sources_dir=req.sources_dir)
    pch = sys.modules.get("kjit.compiler.pch")   # loaded by a compile a PCH may serve
    used = pch.note() if pch is not None and req.backend != "hip" else None
    if isinstance(job, Observed):
        job.seen = seen
    # a copy: the key's own description must not change if a caller edits the metadata
    from copy import deepcopy
    described = deepcopy(job.base["options"]) if job is not None else req.options.describe()
    return ObjectCode(code, kind=req.target, arch=req.arch, log=log, symbols=symbols,
                      name=req.name, metadata={
                          "compiler": compiler_version(req.backend), "compile_ms": round(ms, 3),
                          "options": described, "backend": req.backend,
                          "name_expressions": list(req.name_expressions),
                          "declarations": declarations.extract(
                              req.source, declarations.macros_of(req.options)),
                          **({"pch": used} if used else {})})


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CacheWarning, stacklevel=4)


# --- the key of a call seen before, in this process -------------------------------------------
def _keep(req: CompileRequest, plan: Any = None) -> None:
    from .kept import keep
    keep(req, plan)


class _Memo:
    __slots__ = ("key", "snapshot", "create", "check", "meta", "label", "token", "checks", "kept")

    def __init__(self, key: CompileKey, req: CompileRequest):
        self.key, self.snapshot, self.check = key.key, key.snapshot, key.check
        self.create = partial(compile_uncached, req, key.job.path, key.job)
        self.meta, self.label = key.job.meta, req.name
        self.token: Any = None
        self.checks = 0
        self.kept: Any = None
        if req.sources_dir is not None:
            from .kept import Plan
            self.kept = Plan(req)

    def valid(self) -> bool:
        snap = self.snapshot
        if snap.cwd is not None and os.getcwd() != snap.cwd:
            return False
        if not snap.files and not snap.dirs:  # (the variables it read are in the signature)
            return True
        if self.token is None and self.checks < STAT_CHECKS_BEFORE_WATCHING:
            # The first repeat only stats (~1 ms for 500 headers); watching costs ~10x that
            # once, so it starts with the second repeat, when repeats look like a habit.
            self.checks += 1
            return snap.check()
        ok, self.token = _watch().validate(snap, self.token)
        return ok


_memo: dict[tuple, _Memo] = {}
_watch_mod: Any = None


def _watch() -> Any:
    global _watch_mod
    if _watch_mod is None:  # loaded once: an import statement per call costs microseconds
        from .keys import watch
        _watch_mod = watch
    return _watch_mod


def _remember(sig: tuple, key: CompileKey, req: CompileRequest) -> None:
    snap = key.snapshot
    if snap is not None and snap.env:   # (read from a manifest another process filed)
        watch_env(sig[3], snap.env)
    if len(_memo) >= _MEMO_MAX:
        _memo.clear()
    _memo[sig] = _Memo(key, req)


def _signature(source: Any, arch: Any, target: Any, backend: Any, name: Any, exprs: Any,
               options: Any) -> tuple | None:
    """The call's arguments as a memo key, or None if one is unhashable (validation then says
    what is wrong). CompileOptions' dicts are mutable, so they are copied as tuples."""
    # every variable the cache keys or a compile of this process read (description.watch_env): a
    # call after one changed is another call (the list only grows: an older entry's
    # signature is shorter, never matched again)
    env_sig = tuple(map(_env_get, ENV_WATCHED.get(backend, ())))
    try:
        if options is not None:
            if not isinstance(options, CompileOptions):
                return None
            options = (type(options), tuple(tuple(v.items()) if isinstance(v, dict) else v
                                            for v in options.values()))
        sig = (source, arch, target, backend, name, exprs, options, env_sig)
        hash(sig)
    except TypeError:
        return None
    return sig
