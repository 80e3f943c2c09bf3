"""The compile key: what describes a request (namespace "compile"), what its manifest is filed
under, and the key of an observed compile, from what the compiler read.

The key covers: the source, its name, every file the compiler read with its contents, the
in-memory headers, all options after normalisation, name expressions, target, arch, backend,
the compiler's identity and version, the environment variables that change compilation
(kjit.cache.key.KEY_ENV_VARS) and the cache schema version.
"""
from __future__ import annotations

from typing import Any

from ..cache.key import env_fingerprint, key_hash, sha256
from .identity import compiler_identity

NAMESPACE = "compile"


class HeadersChanged(Exception):
    """A header changed between keying and compiling: the result must not be stored."""


class NotObserved(Exception):
    """The compiler's file calls could not be observed in this process after all."""


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


def manifest_key(req: Any, path: Any, observed: bool = False) -> str:
    """What a compile's manifest is filed under: everything in its key but the headers, plus
    where they are searched for, the in-memory headers' contents and how keys were made
    (observed or scanned: a scanned key never answers an observed lookup)."""
    desc = describe(req, None)
    if observed:
        desc["keyed_by"] = "observation"
    desc["search"] = list(path.dirs)
    desc["memory"] = {n: sha256(t) for n, t in path.headers.items()}
    return key_hash("compile-manifest", desc)


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


def portable_key(req: Any, path: Any) -> dict[str, Any]:
    """What another install's or node's record of this compile is filed under (portable.py)."""
    from . import portable
    desc = dict(describe(req, None), keyed_by="observation")
    return portable.record_key(desc, path.dirs, {n: sha256(t) for n, t in path.headers.items()},
                               req.options)


class Observed:
    """One request's observed compiles: api.compile_uncached(req, path, self) fills `seen`
    (what the compiler read) and `started`; key() turns the last one into its key."""

    def __init__(self, req: Any, path: Any):
        self.req, self.path = req, path
        self.seen: list = []
        self.started = 0.0
        self.desc: dict | None = None
        self.read: list = []
        self.probed: list = []

    def key(self) -> tuple[str | None, Any]:
        """(key, Snapshot) of the last compile, or (None, None) when what it read changed
        while it ran (the result may be returned, never stored). NotObserved when this
        process could not observe the compiler after all."""
        from . import observe
        from .snapshot import from_observation
        if not self.seen:
            raise NotObserved()
        got = from_observation(observe.merge(self.seen), self.started)
        if got is None:
            return None, None
        snap, self.read, self.probed = got
        self.desc = observed_description(self.req, self.path, self.read, self.probed)
        return key_hash(NAMESPACE, self.desc), snap

    def meta(self) -> dict[str, Any]:
        """The entry's metadata: the key's description and the source."""
        return {"key": self.desc, "source": self.req.source}

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
