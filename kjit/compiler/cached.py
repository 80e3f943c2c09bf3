"""kjit.compile: make the request, derive its key, look it up or compile.

The key (compiler/keys/) covers everything that can change the output, including every file
the compiler read. What it read is observed, not guessed (compiler/keys/observe.py): a miss
compiles with the compiler's file calls recorded, keys the result by the files it opened and
remembers, in a manifest filed under everything known before compiling (ccache's direct
mode, compiler/keys/manifest.py), the Snapshot of those files and of every path it looked for and
did not find. A later lookup checks that Snapshot (stats; a re-read only on change) to find
the key without compiling; in process the key is memoised by the call's arguments and
trusted while change notification (compiler/keys/watch.py) reports nothing. A result whose inputs
changed while it was compiled is returned, never stored. Where the compiler cannot be
observed (the C extension is not built, KJIT_OBSERVE=0), a compile that could read a header
is not cached (said once per process); one that cannot is keyed by the request alone.
"""
from __future__ import annotations

import contextlib
import os
import time
import warnings
from functools import partial
from typing import Any, Callable, Iterable

from .. import arch as arch_mod
from ..cache import CacheWarning
from ..cache import key_hash
from ..cache import Made, bypass, creation_lock, enabled_by_env, lookup_hashed, unstorable
from ..errors import InvalidOptionError
from ..settings import switch_on
from ..objectcode import ObjectCode
from .keys import includes, manifest
from . import include_path
from .keys.description import ENV_WATCHED, NAMESPACE, Described, HeadersChanged, NotObserved, Observed
from .keys.description import env_get as _env_get, watch_env
from .options import CompileOptions, leaks_state
from .request import BACKENDS, CompileRequest, make_request

__all__ = ["compile", "compile_key", "make_request", "CompileRequest", "BACKENDS"]

_RETRIES = 3
_MEMO_MAX = 4096
STAT_CHECKS_BEFORE_WATCHING = 1


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

    arch: "sm_90", "compute_90", "gfx90a"...; None means the current device, else $KJIT_ARCH.
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
        arch = arch_mod.resolve(None, backend).name
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
            keyed = _derive_key(req, path)
        except includes.UnresolvedInclude as exc:
            # NotKeyed says once for the process what to do; a computed include, per kernel
            _warn_once(str(exc) if isinstance(exc, includes.NotKeyed)
                       else f"{req.name}: {exc}; compiling without the cache")
            if getattr(exc, "compiled", None) is not None:
                return exc.compiled.with_(cache_hit=None)
            return bypass(NAMESPACE, partial(compile_uncached, req, path), req.name)
        if keyed.key is None:  # what it read changed while it compiled: returned, not stored
            unstorable(NAMESPACE, req.name)
            return keyed.made.obj.with_(cache_hit=None)
        if sig is not None:
            _remember(sig, keyed, req)
        create, check = (keyed.made, keyed.made_check) if keyed.made else (keyed.create, keyed.check)
        stored = False
        try:
            obj = lookup_hashed(keyed.key, NAMESPACE, create, label=req.name, meta=keyed.meta,
                                t0=t0, check=check)
            stored = True
        except HeadersChanged:
            continue
        finally:
            if keyed.stored is not None:
                keyed.stored(stored)
        return obj
    return bypass(NAMESPACE, partial(compile_uncached, req, path), req.name)


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
        try:
            keyed = _derive_key(req, path)
        except CompileError:
            break
        if keyed.key is not None:
            return keyed.key
        time.sleep(timestamp_granularity())  # a header changed as it compiled: again
    return _scanned_key(Described(req, path)).key


def compile_uncached(req: CompileRequest, path: include_path.SearchPath | None = None,
                     job: Described | None = None) -> ObjectCode:
    """Run the compiler for a validated request, searching includes along `path` (default:
    the request's include_path.for_options); `job`: the request's key descriptions, whose options
    description the metadata reuses; an Observed one records what the compiler read. The
    compiler's modules (and the regexes declarations are scanned with) load only here."""
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
    from .pch import note  # how a precompiled header served this compile, if one did
    used = note() if req.backend != "hip" else None
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


# --- deriving the key ------------------------------------------------------------------------
class Keyed:
    """A request's key and how to make its entry: `create` compiles, then `check` raises
    HeadersChanged if what the key was derived from changed meanwhile. `made`: a result
    compiled already (to find the key), stored if `made_check` passes. key None: made, but
    not storable."""

    __slots__ = ("key", "snapshot", "create", "check", "meta", "label", "made", "made_check",
                 "stored")

    def __init__(self, key: str | None, snapshot: Any, create: Callable[[], ObjectCode],
                 check: Callable[[], None] | None, meta: Callable[[], dict], label: str,
                 made: Made | None = None, made_check: Callable[[], None] | None = None):
        self.key, self.snapshot, self.create, self.check = key, snapshot, create, check
        self.meta, self.label, self.made, self.made_check = meta, label, made, made_check
        # called with whether the entry was stored: files the record and lets the cluster's
        # lease go (portable.claim), where this process compiled a kernel new to the cluster
        self.stored: Callable[[bool], None] | None = None


def _file_then_release(publish: Callable[[], None] | None, held: Any, stored: bool) -> None:
    try:
        if stored and publish is not None:
            publish()
    finally:
        held.release()


def _derive_key(req: CompileRequest, path: include_path.SearchPath) -> Keyed:
    """The key from the manifest of what this request's compile read, else by compiling it
    observed (once across processes: the others wait, then read its manifest). Where
    compiles cannot be observed, only a compile that reads no header has a key
    (_unobserved_key)."""
    job = Observed(req, path)   # the request described once, for every key made below
    if not switch_on("KJIT_OBSERVE"):  # whether the hooks work is asked only on a manifest miss
        return _unobserved_key(job)
    prekey = job.manifest_key(observed=True)
    found = manifest.lookup(prekey)
    if found is None and not _observer().available(req.backend):
        return _unobserved_key(job)
    if found is None:
        # the compile's modules load before the lock, whose holder opens the cache databases
        # on a helper thread: that thread's Python then runs beside NVRTC, not beside these
        from .keys import portable, snapshot  # noqa: F401
        if req.backend == "cuda":
            from . import nvrtc
            if not nvrtc.deferring.get():
                # NVRTC's first compile calls cuInit where a driver is installed: started
                # now, it overlaps cuda.bindings' import and NVRTC's load instead
                from .. import driver
                driver.start_init(context=False)
        with creation_lock("manifest-" + prekey):
            found = manifest.lookup(prekey)
            from .keys import portable  # a manifest miss only: a disk hit never loads it
            held = None   # the cluster's lease on this kernel's record (portable.claim)
            if found is None:  # another install's or node's record, checked here
                record = job.portable_key()
                found = portable.find(record, req.options)
                if found is None:
                    found, held = portable.claim(record, req.options)
                if found is not None:
                    found[1].env = job.portable_env()   # checked from now on, as observed ones are
                    manifest.store(prekey, *found)
            if found is None:
                try:
                    t0 = time.perf_counter()
                    obj = compile_uncached(req, path, job)
                    try:
                        k, snap = job.key()
                    except NotObserved:  # the hooks could not be installed after all
                        return _unobserved_key(job, compiled=obj)
                    made = Made(obj, time.perf_counter() - t0)
                    if k is None:
                        return Keyed(None, None, made, None, job.meta, req.name, made)
                    manifest.store(prekey, k, snap)
                    # filed when it read no environment variable the record is not keyed by;
                    # under the cluster's lease, once the binary is in the tier (Keyed.stored)
                    publish = partial(portable.publish, record, k, snap, job.read, job.probed,
                                      req.options) if job.portable else None
                    if held is None and publish is not None:
                        publish()
                    keyed = Keyed(k, snap, partial(compile_uncached, req, path, job),
                                  partial(job.check, k, snap), job.meta, req.name, made)
                    if held is not None:
                        keyed.stored = partial(_file_then_release, publish, held)
                        held = None
                    return keyed
                finally:
                    if held is not None:   # failed, or nothing to file: the others compile
                        held.release()
    k, snap = found
    return Keyed(k, snap, partial(compile_uncached, req, path, job), partial(job.check, k, snap),
                 job.meta, req.name)


def _unobserved_key(d: Described, compiled: ObjectCode | None = None) -> Keyed:
    """The key of a request `d` describes where its compile cannot be observed: the request
    alone, for a compile that reads no header. One that may (an #include, __has_include or
    #import anywhere in its text, in-memory headers, include directories or include flags)
    raises includes.NotKeyed (carrying `compiled`, a binary made already): kjit does not
    guess which files a compile reads (docs/headers.md)."""
    from .keys.snapshot import Snapshot
    req = d.req
    if isinstance(d, Observed):   # its compiles would be observed: these are not
        d = d.unobserved()
    why = includes.header_dependent(req.source, req.options)
    if why is not None:
        exc = includes.NotKeyed(_observer_off_reason(), why)
        exc.compiled = compiled
        raise exc
    d.desc = d.scanned(None)
    made = None if compiled is None else Made(compiled, 0.0)
    return Keyed(key_hash(NAMESPACE, d.desc), Snapshot(), partial(compile_uncached, req, d.path, d),
                 None, d.meta, req.name, made, None)


def _observer_off_reason() -> str:
    if not switch_on("KJIT_OBSERVE"):
        return "KJIT_OBSERVE=0 turns the compile observer off"
    return _observer().describe()["reason"] or "the compile observer is unavailable"


def _scanned_key(d: Described) -> Keyed:
    """compile_key's answer for a source that does not compile (so has no observed key):
    the key from kjit's include scan. Never used to store or find a binary."""
    req, opts = d.req, d.req.options
    res = None
    if includes.may_read_headers(req.source, opts.extra):
        res = includes.resolve(req.source, name=req.name, search=d.path, defines=opts.defines,
                               extra=opts.extra)
    d.desc = d.scanned(res)
    return Keyed(key_hash(NAMESPACE, d.desc), None, partial(compile_uncached, req, d.path, d),
                 None, d.meta, req.name)


def _observer() -> Any:
    from .keys import observe  # a manifest miss only: a disk hit never loads it
    return observe


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

    def __init__(self, keyed: Keyed, req: CompileRequest):
        self.key, self.snapshot, self.create = keyed.key, keyed.snapshot, keyed.create
        self.check, self.meta, self.label = keyed.check, keyed.meta, keyed.label
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


def _remember(sig: tuple, keyed: Keyed, req: CompileRequest) -> None:
    snap = keyed.snapshot
    if snap is not None and snap.env:   # (read from a manifest another process filed)
        watch_env(sig[3], snap.env)
    if len(_memo) >= _MEMO_MAX:
        _memo.clear()
    _memo[sig] = _Memo(keyed, req)


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
