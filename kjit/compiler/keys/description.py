"""A compile key's description (namespace "compile"; each input is listed in keys/__init__.py):
worked out once per request (Described), what its manifest and another install's record are
filed under, and the key of an observed compile, from what the compiler read (Observed)."""
from __future__ import annotations

import os
from typing import Any

from ...cache import KEY_ENV_VARS, env_fingerprint, key_hash, sha256_hex as sha256
from .identity import compiler_identity

NAMESPACE = "compile"

# The environment variables each backend's compiler is known to read (observed; NVRTC 13:
# the finalizer's on a cubin for sm_90 and later, EDG's and NVVM's on every compile, and
# LLVM_OVERRIDE_PRODUCER as it loads; NVRTC 12 reads NVRTCWIZ, NVRTC_APPEND_FLAGS,
# EDG_MODULES_PATH and DUMP_KNOBS_TO_FILE on every compile instead of the finalizer's):
# another install's record of a compile is keyed by their values, and a compile that read
# any other is not filed for other installs. The two lists are one: a variable one family
# never reads is never read there, so naming it costs nothing.
PORTABLE_ENV = {
    "cuda": ("CAN_FINALIZE_DEBUG", "CUDA_CACHE_DISABLE", "DUMP_KNOBS_TO_FILE", "EDG_BASE",
             "EDG_MODULES_PATH", "FINALIZER_CUBIE", "FINALIZER_USE_LEGACY_ELF_BUILDER",
             "LLVM_OVERRIDE_PRODUCER", "NVRTCWIZ", "NVRTC_APPEND_FLAGS", "NVVM_IR_VER_CHK"),
    "hip": (),
}
_warned: set[str] = set()

# The variables an in-process repeat of a call compares (cached._signature): those the cache
# keys for every compile, those the compiler is known to read, and every other one a compile
# of this process was seen to read. Names as os.environ's own dict holds them (bytes on
# POSIX), so each costs one dict lookup.
_ENVIRON = getattr(os.environ, "_data", None)
_RAW = isinstance(_ENVIRON, dict) and os.name == "posix"
env_get = _ENVIRON.get if _RAW else os.environ.get
ENV_WATCHED: dict[str, tuple] = {}


def _raw(name: str) -> Any:
    return os.fsencode(name) if _RAW else name


def watch_env(backend: str, names: Any) -> None:
    """Compare `names` too on every in-process repeat of a `backend` call from now on."""
    have = ENV_WATCHED.get(backend, ())
    new = tuple(dict.fromkeys(r for r in map(_raw, names) if r not in have))
    if new:
        ENV_WATCHED[backend] = have + new


def _start_watching() -> None:
    for backend in set(KEY_ENV_VARS) | set(PORTABLE_ENV):
        watch_env(backend, KEY_ENV_VARS.get(backend, ()) + PORTABLE_ENV.get(backend, ()))
    # where a debuggable compile's sources are kept, and whether they are (compiler/kept.py)
    watch_env("cuda", ("KJIT_CACHE_DIR", "KJIT_DEBUG_SOURCES"))


def _warn_unkeyable(name: str, why: str) -> None:
    """Say once per reason why a compile was returned and not stored."""
    if why in _warned:
        return
    _warned.add(why)
    import warnings
    from ...cache import CacheWarning
    warnings.warn(f"{name}: not cached: {why}; the binary is returned, not stored (remove "
                  "that path from the compile's includes to cache it)", CacheWarning, stacklevel=5)


class HeadersChanged(Exception):
    """A header changed between keying and compiling: the result must not be stored."""


class NotObserved(Exception):
    """The compiler's file calls could not be observed in this process after all."""


class UnresolvedInclude(Exception):
    """An #include whose target kjit cannot work out (a computed include, includes.py)."""


class NotKeyed(UnresolvedInclude):
    """A compile that may read headers, where the compiler cannot be observed: it runs
    uncached (kjit's include scan would be a guess: macros, digraphs, comments in
    directives, split flags, symlinks with .., __has_include of a macro all defeat it)."""

    def __init__(self, reason: str, why: str):
        super().__init__(
            f"kjit does not cache compiles that may read headers in this process ({why}, as "
            f"this one does): {reason}, and without it kjit cannot tell which files a compile "
            "reads. Build kjit's C extension (reinstall kjit where a C compiler is found) and "
            "leave KJIT_OBSERVE on to cache them; compiles without headers are still cached")
        self.reason, self.why = reason, why


def describe(req: Any, res: Any) -> dict[str, Any]:
    """The compile key's canonical description for a request and its include resolution."""
    return {
        "source_sha256": sha256(req.source), "name": req.name, "arch": req.arch,
        "target": req.target, "backend": req.backend, "options": req.options.describe(),
        "name_expressions": list(req.name_expressions), "compiler": compiler_identity(req.backend),
        "env": env_fingerprint(req.backend), **(_headers_key(res, req.options) if res is not None else {}),
        # the kept sources' directory: the binary's line table names files below it
        **({"sources_dir": req.sources_dir} if getattr(req, "sources_dir", None) else {}),
    }


def _headers_key(res: Any, options: Any) -> dict[str, list]:
    """The headers part of a key: headers under kjit's own roots named below their root
    (roots.py), unless line or debug information puts their paths into the binary."""
    from . import roots
    out, name = res.key(), roots.namer(options)
    out["headers"] = [[kind, name(path) if kind == "file" else path, digest]
                      for kind, path, digest in out["headers"]]
    return out


class Described:
    """One request's key descriptions, from a description of everything but the headers and
    the in-memory headers' digests, each worked out once per request: the manifest's key,
    another install's record, the observed or scanned key and the entry's metadata all reuse
    them (the source is hashed and the options described once per miss)."""

    def __init__(self, req: Any, path: Any):
        self.req, self.path = req, path
        self._base: dict[str, Any] | None = None
        self._memory: dict[str, str] | None = None
        self.desc: dict[str, Any] | None = None   # the key's whole description, once known

    @property
    def base(self) -> dict[str, Any]:
        """The key's description without headers (callers copy it before adding to it)."""
        if self._base is None:
            self._base = describe(self.req, None)
        return self._base

    @property
    def memory(self) -> dict[str, str]:
        """The in-memory headers' digests, by name."""
        if self._memory is None:
            self._memory = {n: sha256(t) for n, t in self.path.headers.items()}
        return self._memory

    def unobserved(self) -> "Described":
        """The same request's descriptions (those worked out kept), for compiles not observed."""
        out = Described(self.req, self.path)
        out._base, out._memory = self._base, self._memory
        return out

    def manifest_key(self, observed: bool = False) -> str:
        """What a compile's manifest is filed under: everything in its key but the headers,
        plus where they are searched for, the in-memory headers' contents and how keys were
        made (observed or scanned: a scanned key never answers an observed lookup)."""
        desc = dict(self.base)
        if observed:
            desc["keyed_by"] = "observation"
        desc["search"] = list(self.path.dirs)
        desc["memory"] = self.memory
        return key_hash("compile-manifest", desc)

    def portable_key(self) -> dict[str, Any]:
        """What another install's or node's record of this compile is filed under (portable.py):
        with the values here of the environment variables the compiler is known to read, so a
        record is found only where they are the same (Observed.portable says whether a
        compile read only those)."""
        from . import portable
        desc = dict(self.base, keyed_by="observation")
        known = PORTABLE_ENV.get(self.req.backend, ())
        present = [[n, v] for n, v in zip(known, map(os.environ.get, known)) if v is not None]
        if present:   # as in the compile key: the variables set
            desc["env_read"] = present
        return portable.record_key(desc, self.path.dirs, self.memory, self.req.options)

    def portable_env(self) -> dict[str, str | None]:
        """The variables another install's record was found under, with their values here:
        what a local manifest made from it checks (Snapshot.env)."""
        known = PORTABLE_ENV.get(self.req.backend, ())
        return dict(zip(known, map(os.environ.get, known)))

    def observed(self, read: list, probed: list, env: dict | None = None) -> dict[str, Any]:
        """The compile key's description from what an observed compile read: each file by its
        name relative to the root it was found under (so the key does not depend on where the
        toolkit is installed) and its contents, the files it found but did not read, the
        environment variables it read that are set, with their values, and the in-memory
        headers."""
        from . import roots
        name = roots.namer(self.req.options)
        desc = dict(self.base)
        desc["memory"] = self.memory
        desc["read"] = sorted([name(p), sha] for p, sha in read)
        desc["probed"] = sorted(name(p) for p in probed)
        # the variables set: one read unset is checked (Snapshot.env), not keyed, so compiles
        # that read different names (with a precompiled header, without) share a key
        present = sorted([n, v] for n, v in (env or {}).items() if v is not None)
        if present:
            desc["env_read"] = present
        return desc

    def scanned(self, res: Any) -> dict[str, Any]:
        """The compile key's description from kjit's include scan `res` (None: no headers)."""
        return dict(self.base, **(_headers_key(res, self.req.options) if res is not None else {}))

    def meta(self) -> dict[str, Any]:
        """An entry's metadata: the key's description (`desc`, once known, else the one
        without headers), the source and its digest (the lookup would hash it again)."""
        out = {"key": dict(self.base) if self.desc is None else self.desc,
               "source": self.req.source, "source_sha256": self.base["source_sha256"]}
        if self.req.sources_dir is not None:   # what `kjit cache prune` keeps for this entry
            from ..kept import kept_paths
            out["kept_sources"] = kept_paths(self.req)
        return out


def manifest_key(req: Any, path: Any, observed: bool = False) -> str:
    """What a compile's manifest is filed under (Described.manifest_key), for one request."""
    return Described(req, path).manifest_key(observed)


class Observed(Described):
    """One request's observed compiles: cached.compile_uncached(req, path, self) fills `seen`
    (what the compiler read) and `started`; key() turns the last one into its key."""

    def __init__(self, req: Any, path: Any):
        super().__init__(req, path)
        self.seen: list = []
        self.started = 0.0
        self.read: list = []
        self.probed: list = []
        self.portable = False   # the last compile's record may be filed for other installs

    def key(self) -> tuple[str | None, Any]:
        """(key, Snapshot) of the last compile, or (None, None) when what it read changed
        while it ran (the result may be returned, never stored). NotObserved when this
        process could not observe the compiler after all."""
        from . import observe
        from .snapshot import from_observation
        if not self.seen:
            raise NotObserved()
        obs = observe.merge(self.seen)
        if obs.unkeyable:
            _warn_unkeyable(self.req.name, obs.unkeyable)
        got = from_observation(obs, self.started)
        if got is None:
            return None, None
        snap, self.read, self.probed = got
        watch_env(self.req.backend, snap.env)
        self.desc = self.observed(self.read, self.probed, snap.env)
        known = PORTABLE_ENV.get(self.req.backend, ())
        self.portable = all(n in known for n in snap.env)
        return key_hash(NAMESPACE, self.desc), snap

    def check(self, k: str, snap: Any) -> None:
        """After compiling again for key `k` (its entry was gone): HeadersChanged unless the
        compile read what `snap` holds (a compiler may read fewer files once it has cached
        some, as clang does /etc/os-release: a subset with the same contents is the same)."""
        try:
            k2, _ = self.key()
        except NotObserved:
            raise HeadersChanged() from None
        if k2 != k and (k2 is None or not self.within(snap)):
            raise HeadersChanged()

    def within(self, snap: Any) -> bool:
        """True if the last compile read only files `snap` holds, with the same contents, and
        found only files it holds."""
        files = snap.files
        return all(p in files and files[p][4] == sha for p, sha in self.read) and \
            all(p in files for p in self.probed)


_start_watching()
