"""kjit.compile: the source passes down once — validate the request, find the exact key,
look it up in the cache, compile on a miss, store, return ObjectCode.

The key (namespace "compile") covers: the source, its name, every file the compiler read
with its contents, the in-memory headers, all options after normalisation, name
expressions, target, arch, backend, the compiler's identity and version, the environment
variables that change compilation (kjit.cache.key.KEY_ENV_VARS) and the cache schema version.

What the compiler read is observed, not guessed (compiler/observe.py): a miss compiles with
the compiler's file calls recorded, keys the result by the files it opened and remembers,
in a manifest filed under everything known before compiling (ccache's direct mode,
kjit.compiler.manifest), the Snapshot of those files and of every path it looked for and
did not find. A later lookup checks that Snapshot (stats; a re-read only on change) to find
the key without compiling; in process the key is memoised by the call's arguments and
trusted while change notification (kjit.compiler.watch) reports nothing. A result whose
inputs changed while it was compiled is returned, never stored.

Where the compiler cannot be observed (the C extension is not built, KJIT_OBSERVE=0), the
key comes from kjit's own include scan (kjit.compiler.includes) as before.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable, Iterable

from .. import arch as arch_mod
from ..cache.core import Made, bypass, creation_lock, enabled_by_env, lookup_hashed, unstorable
from ..cache.key import KEY_ENV_VARS, env_fingerprint, key_hash, sha256
from ..cache.settings import switch_on
from ..cache.store import CacheWarning
from ..objectcode import ObjectCode
from . import includes, manifest, search
from .identity import compiler_identity
from .options import CompileOptions
from .request import BACKENDS, CompileRequest, make_request

__all__ = ["compile", "compile_key", "make_request", "CompileRequest", "BACKENDS"]

NAMESPACE = "compile"
_MEMO_MAX = 4096


class _Memo:
    __slots__ = ("key", "snapshot", "token", "checks", "create", "label", "meta")

    def __init__(self, key: str, snapshot: Any, create: Callable[[], ObjectCode], label: str,
                 meta: Callable[[], dict]):
        self.key, self.snapshot, self.create, self.label, self.meta = key, snapshot, create, label, meta
        self.token: Any = None
        self.checks = 0

    def valid(self) -> bool:
        snap = self.snapshot
        if snap.cwd is not None and os.getcwd() != snap.cwd:
            return False
        if snap.empty:
            return True
        if self.token is None and self.checks < STAT_CHECKS_BEFORE_WATCHING:
            # The first repeat only stats (~1 ms for 500 headers); watching costs ~10x that
            # once, so it starts with the second repeat, when repeats look like a habit.
            self.checks += 1
            return snap.check()
        ok, self.token = _watch().validate(snap, self.token)
        return ok


def _watch() -> Any:
    global _watch_mod
    if _watch_mod is None:  # loaded once: an import statement per call costs microseconds
        from . import watch
        _watch_mod = watch
    return _watch_mod


_watch_mod: Any = None


class _HeadersChanged(Exception):
    """A header changed between keying and compiling: the result must not be stored."""


_RETRIES = 3
STAT_CHECKS_BEFORE_WATCHING = 1


_memo: dict[tuple, _Memo] = {}
_warned: set[str] = set()


def _options_sig(options: Any) -> Any:
    """A hashable picture of CompileOptions (its dicts are mutable, so copy them as tuples).
    TypeError for anything else: make_request then says what is wrong."""
    if options is None:
        return None
    if not isinstance(options, CompileOptions):
        raise TypeError("not CompileOptions")
    return (type(options), tuple(tuple(v.items()) if isinstance(v, dict) else v
                                 for v in options.values()))


def compile(source: str, *, arch=None, target: str | None = None,
            options: CompileOptions | None = None, name_expressions: Iterable[str] = (),
            backend: str = "cuda", name: str | None = None, cache: bool = True) -> ObjectCode:
    """Compile CUDA (NVRTC) or HIP (hiprtc) source to PTX, cubin, LTO-IR or an AMD code object.

    arch: "sm_90", "compute_90", "gfx90a"...; None means the current device, else $KJIT_ARCH.
    target: "cubin" (default for CUDA), "ptx", "ltoir"; "hsaco" for HIP.
    Raises InvalidOptionError for bad arguments and CompileError (with log and source
    excerpts) when the compiler rejects the source.
    """
    t0 = time.perf_counter()
    if not cache or not enabled_by_env():
        req = make_request(source, arch=arch, target=target, options=options,
                               name_expressions=name_expressions, backend=backend, name=name)
        return bypass(NAMESPACE, lambda: compile_uncached(req), req.name)
    if not isinstance(name_expressions, tuple) and not isinstance(name_expressions, str):
        name_expressions = tuple(name_expressions)
    if arch is None:  # the current device (or $KJIT_ARCH): may differ from call to call
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
    if memo is not None and memo.valid():
        try:
            return lookup_hashed(memo.key, NAMESPACE, memo.create, label=memo.label,
                                 meta=memo.meta, t0=t0)
        except _HeadersChanged:  # its entry was gone, and a compile now reads other files
            _memo.pop(sig, None)

    req = make_request(source, arch=arch, target=target, options=options,
                       name_expressions=name_expressions, backend=backend, name=name)
    keyed = _keyed_observed if _observing() else _keyed
    for _ in range(_RETRIES):
        try:
            return keyed(req, sig, t0)
        except _HeadersChanged:
            continue
    return bypass(NAMESPACE, lambda: compile_uncached(req), req.name)


def compile_uncached(req: CompileRequest) -> ObjectCode:
    """Run the compiler (its module, and the regexes it scans declarations with, load only on
    a miss)."""
    from .run import compile_uncached as run
    return run(req)


def _keyed(req: CompileRequest, sig: tuple | None, t0: float,
           compiled: ObjectCode | None = None) -> ObjectCode:
    """Key `req` by scanning (from a manifest, else by resolving its includes), remember the
    key, and look it up. `compiled`: a binary already made for it (stored only if the
    headers still hold)."""
    opts = req.options
    path = search.for_options(opts, req.backend)
    prekey = None
    found = None
    if includes.may_read_headers(req.source, opts.extra):
        prekey = manifest_key(req, path)
        found = manifest.lookup(prekey)
    res = None
    if found is not None:
        k, snap = found
    else:
        try:
            res = includes.resolve(req.source, name=req.name, search=path, defines=opts.defines,
                                   extra=opts.extra)
        except includes.UnresolvedInclude as exc:
            if str(exc) not in _warned:
                _warned.add(str(exc))
                warnings.warn(f"{req.name}: {exc}; compiling without the cache", CacheWarning,
                              stacklevel=4)
            if compiled is not None:
                return compiled.with_(cache_hit=None)
            return bypass(NAMESPACE, lambda: compile_uncached(req), req.name)
        k, snap = key_hash(NAMESPACE, describe(req, res)), res.snapshot
        if prekey is not None and not snap.empty:
            manifest.store(prekey, k, snap)
    state = {"res": res}

    def create() -> ObjectCode:
        if state["res"] is None:  # keyed from a manifest: the entry's metadata needs the key
            state["res"] = includes.resolve(req.source, name=req.name, search=path,
                                            defines=opts.defines, extra=opts.extra)
            if key_hash(NAMESPACE, describe(req, state["res"])) != k:
                raise _HeadersChanged()
        obj = compile_uncached(req) if compiled is None else compiled
        if not snap.check():
            raise _HeadersChanged()
        return obj

    meta = lambda: {"key": describe(req, state["res"]), "source": req.source}  # noqa: E731
    if sig is not None:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[sig] = _Memo(k, snap, create, req.name, meta)
    return lookup_hashed(k, NAMESPACE, create, label=req.name, meta=meta, t0=t0)


class _Observed:
    """The key of a compile from what it read, or None (with the binary) where it cannot be."""

    def __init__(self, req: CompileRequest, path: Any):
        self.req, self.path = req, path
        self.desc: dict | None = None
        self.read: list = []
        self.probed: list = []

    def within(self, snap: Any) -> bool:
        """True if the last compile read only files `snap` holds, with the same contents, and
        found only files it holds: its binary is then the one `snap`'s key describes (a
        compiler may read fewer files once it has cached some, as clang does /etc/os-release)."""
        files = snap.files
        return all(p in files and files[p][4] == sha for p, sha in self.read) and \
            all(p in files for p in self.probed)

    def compile(self) -> tuple[ObjectCode, str | None, Any]:
        """Compile, observed: (binary, key or None, Snapshot). Raises _NotObserved when this
        process cannot observe the compiler after all (the binary rides on it)."""
        from .snapshot import from_observation
        started = time.time()
        observe = _observer()
        with observe.collecting() as seen:
            obj = compile_uncached(self.req)
        if not seen:
            raise _NotObserved(obj)
        got = from_observation(observe.merge(seen), started)
        if got is None:
            return obj, None, None
        snap, self.read, self.probed = got
        self.desc = observed_description(self.req, self.path, self.read, self.probed)
        return obj, key_hash(NAMESPACE, self.desc), snap


class _NotObserved(Exception):
    def __init__(self, obj: ObjectCode):
        super().__init__("not observed")
        self.obj = obj


def _observing() -> bool:
    """KJIT_OBSERVE's switch alone: whether the compiler can be hooked (observe.available,
    which loads the C extension) is asked only on a manifest miss, so a disk hit loads
    neither. A manifest filed by observation exists only where observing worked."""
    return switch_on("KJIT_OBSERVE")


def _observer() -> Any:
    from . import observe
    return observe


def _keyed_observed(req: CompileRequest, sig: tuple | None, t0: float) -> ObjectCode:
    """Key `req` from its manifest, else compile it observed and key it by what it read."""
    path = search.for_options(req.options, req.backend)
    prekey = manifest_key(req, path, observed=True)
    job = _Observed(req, path)
    meta = lambda: {"key": job.desc, "source": req.source}  # noqa: E731
    found = manifest.lookup(prekey)
    if found is None and not _observer().available(req.backend):  # no hooks here: scan
        return _keyed(req, sig, t0)
    if found is None:
        # the compile's modules load before the lock, whose holder opens the cache databases
        # on a helper thread: that thread's Python then runs beside NVRTC, not beside these
        from . import portable, run, snapshot  # noqa: F401
        if req.backend == "cuda":
            from . import nvrtc
            if not nvrtc.deferring.get():
                # NVRTC's first compile calls cuInit where a driver is installed: started
                # now, it overlaps cuda.bindings' import and NVRTC's load instead
                from .. import driver
                driver.start_init(context=False)
        with creation_lock("manifest-" + prekey):  # one process compiles a new kernel
            found = manifest.lookup(prekey)
            from . import portable  # a manifest miss only: a disk hit never loads it
            if found is None:  # another install's or node's record, checked here
                rk = _portable_key(req, path)
                found = portable.find(rk, req.options)
                if found is not None:
                    manifest.store(prekey, *found)
            if found is None:
                made = time.perf_counter()
                try:
                    obj, k, snap = job.compile()
                except _NotObserved as exc:  # the hooks could not be installed: scan instead
                    return _keyed(req, sig, t0, compiled=exc.obj)
                if k is None:
                    unstorable(NAMESPACE, req.name)
                    return obj.with_(cache_hit=None)
                manifest.store(prekey, k, snap)
                portable.publish(rk, k, snap, job.read, job.probed, req.options)
                _remember(sig, k, snap, job, req.name, meta)
                return lookup_hashed(k, NAMESPACE, Made(obj, time.perf_counter() - made),
                                     label=req.name, meta=meta, t0=t0)
    k, snap = found
    return lookup_hashed(k, NAMESPACE, _remember(sig, k, snap, job, req.name, meta).create,
                         label=req.name, meta=meta, t0=t0)


def _remember(sig: tuple | None, k: str, snap: Any, job: _Observed, label: str,
              meta: Callable[[], dict]) -> _Memo:
    def create() -> ObjectCode:  # the entry is gone (evicted): compile it again, observed
        obj, k2, _ = job.compile()
        if k2 != k and (k2 is None or not job.within(snap)):
            raise _HeadersChanged()
        return obj

    memo = _Memo(k, snap, create, label, meta)
    if sig is not None:
        if len(_memo) >= _MEMO_MAX:
            _memo.clear()
        _memo[sig] = memo
    return memo


def observed_description(req: Any, path: Any, read: list, probed: list) -> dict[str, Any]:
    """The compile key's description from what an observed compile read: each file by its
    name relative to the root it was found under (so the key does not depend on where the
    toolkit is installed) and its contents, the files it found but did not read, and the
    in-memory headers."""
    from . import roots
    name = roots.namer(req.options)
    desc = describe(req, None)
    desc["memory"] = {n: sha256(t) for n, t in path.headers.items()}
    desc["read"] = sorted([name(p), sha] for p, sha in read)
    desc["probed"] = sorted(name(p) for p in probed)
    return desc


def _portable_key(req: CompileRequest, path: Any) -> dict[str, Any]:
    from . import portable
    desc = dict(describe(req, None), keyed_by="observation")
    return portable.record_key(desc, path.dirs, {n: sha256(t) for n, t in path.headers.items()},
                               req.options)


def manifest_key(req: CompileRequest, path: Any, observed: bool = False) -> str:
    """What a compile's manifest is filed under: everything in its key but the headers, plus
    where they are searched for, the in-memory headers' contents and how keys were made
    (observed or scanned: a scanned key never answers an observed lookup)."""
    desc = describe(req, None)
    if observed:
        desc["keyed_by"] = "observation"
    desc["search"] = list(path.dirs)
    desc["memory"] = {n: sha256(t) for n, t in path.headers.items()}
    return key_hash("compile-manifest", desc)


def describe(req: Any, res: Any) -> dict[str, Any]:
    """The compile key's canonical description for a request and its include resolution."""
    return {
        "source_sha256": sha256(req.source), "name": req.name, "arch": req.arch,
        "target": req.target, "backend": req.backend, "options": req.options.describe(),
        "name_expressions": list(req.name_expressions), "compiler": compiler_identity(req.backend),
        "env": env_fingerprint(req.backend), **(_headers_key(res, req.options) if res is not None else {}),
    }


def _headers_key(res: Any, options: Any) -> dict[str, list]:
    """The headers part of a key: headers under kjit's own roots named below their root
    (compiler/roots.py), unless line or debug information puts their paths into the binary."""
    from . import roots
    out, name = res.key(), roots.namer(options)
    out["headers"] = [[kind, name(path) if kind == "file" else path, digest]
                      for kind, path, digest in out["headers"]]
    return out


def compile_key(source: str, **kwargs: Any) -> str:
    """The cache key kjit.compile would use for these arguments (for tools and tests). Where
    compiles are observed it is known only from a manifest or by compiling: a compile runs
    when no manifest holds it (its manifest is kept, its binary is not). A source that does
    not compile has no observed key: its scanned one is returned."""
    from ..errors import CompileError
    from .snapshot import timestamp_granularity
    req = make_request(source, **kwargs)
    opts = req.options
    path = search.for_options(opts, req.backend)
    if _observing() and _observer().available(req.backend):
        prekey = manifest_key(req, path, observed=True)
        for _ in range(_RETRIES):
            found = manifest.lookup(prekey)
            if found is not None:
                return found[0]
            try:
                _, k, snap = _Observed(req, path).compile()
            except (_NotObserved, CompileError):
                break
            if k is not None:
                manifest.store(prekey, k, snap)
                return k
            time.sleep(timestamp_granularity())  # a header changed as it compiled: again
    res = includes.resolve(req.source, name=req.name, search=path, defines=opts.defines,
                           extra=opts.extra)
    return key_hash(NAMESPACE, describe(req, res))
