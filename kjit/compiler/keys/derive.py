"""A request's compile key, derived: from the manifest of what its compile read (a Snapshot
that still holds), else from another install's or node's record of it, else from its own
compile, observed (a PendingKey: kjit.compile's lookup runs that compile and finishes the key
from what it read). Where compiles cannot be observed, from the request alone, and only for a
compile that reads no header. Nothing here runs a compiler.
"""
from __future__ import annotations

from typing import Any

from ...cache import PendingKey, key_hash
from ...settings import switch_on
from . import manifest
from .description import NAMESPACE, Described, NotKeyed, NotObserved, Observed


class CompileKey(PendingKey):
    """A request's key (`key`, hashed; None until its compile finishes it, and for a result
    whose headers changed as it compiled), the Snapshot it was derived from (what a repeat
    in this process checks), and `job`, the request's descriptions (its compile fills an
    Observed one with what the compiler read). `lock` is set while the key waits for the
    compile: the manifest's lock, so that processes meeting one new kernel compile it once."""

    def __init__(self, job: Described, key: str | None = None, snapshot: Any = None,
                 prekey: str | None = None):
        self.job, self.key, self.snapshot = job, key, snapshot
        self.prekey = prekey
        self.lock = "" if prekey is None else "manifest-" + prekey
        self.record: Any = None   # what another install's record of it is filed under
        self.held: Any = None     # the cluster's lease on that record (portable.claim)
        self.publish: Any = None  # files the record, once the binary is stored

    @property
    def pending(self) -> bool:
        return self.key is None and self.prekey is not None

    def check(self) -> None:
        """After a compile for a key known before it ran: HeadersChanged unless it read what
        the key was derived from."""
        if self.snapshot is not None and isinstance(self.job, Observed) and self.key is not None:
            self.job.check(self.key, self.snapshot)

    def settle(self) -> str | None:
        """Under the manifest's lock: the key, if another process filed the manifest
        meanwhile, or another install or node filed a record that holds here; else None,
        with this node holding the cluster's lease on the record where there is a tier."""
        from . import portable  # a manifest miss only: a disk hit never loads it
        found = manifest.lookup(self.prekey)
        if found is None:
            job = self.job
            self.record = job.portable_key()
            found = portable.find(self.record, job.req.options)
            if found is None:
                found, self.held = portable.claim(self.record, job.req.options)
            if found is not None:
                found[1].env = job.portable_env()   # checked from now on, as observed ones are
                manifest.store(self.prekey, *found)
        if found is not None:
            self.key, self.snapshot = found
        return self.key

    def finish(self, obj: Any) -> str | None:
        """The key of the compile just observed, from what it read (None: a header changed
        as it compiled), its manifest filed. Where the hooks could not be installed after
        all, the request's own key (NotKeyed, carrying `obj`, for a compile that
        may read a header)."""
        from . import portable
        job = self.job
        try:
            k, snap = job.key()
        except NotObserved:
            done = unobserved(job, compiled=obj)
            self.key, self.snapshot, self.job = done.key, done.snapshot, done.job
            return self.key
        if k is None:
            return None
        manifest.store(self.prekey, k, snap)
        self.key, self.snapshot = k, snap
        if job.portable:   # it read no environment variable the record is not keyed by
            self.publish = lambda: portable.publish(self.record, k, snap, job.read, job.probed,
                                                    job.req.options)
            if self.held is None:   # no cluster waits for it: filed now
                self.publish()
                self.publish = None
        return k

    def close(self, stored: bool) -> None:
        """Under the cluster's lease: the record filed once the binary is in the tier, then
        the lease let go (also when the compile failed: the others then compile)."""
        held, self.held = self.held, None
        if held is None:
            return
        try:
            if stored and self.publish is not None:
                self.publish()
        finally:
            held.release()


def derive_key(req: Any, path: Any) -> CompileKey:
    """The request's key from the manifest of what its compile read; on a manifest miss a
    pending one, which the compile's observation finishes. Where compiles cannot be observed,
    only a compile that reads no header has a key (unobserved)."""
    job = Observed(req, path)   # the request described once, for every key made from it
    if not switch_on("KJIT_OBSERVE"):  # whether the hooks work is asked only on a manifest miss
        return unobserved(job)
    prekey = job.manifest_key(observed=True)
    found = manifest.lookup(prekey)
    if found is not None:
        return CompileKey(job, *found)
    if not _observer().available(req.backend):
        return unobserved(job)
    return CompileKey(job, prekey=prekey)


def unobserved(d: Described, compiled: Any = None) -> CompileKey:
    """The key of a request `d` describes where its compile cannot be observed: the request
    alone, for a compile that reads no header. One that may (an #include, __has_include or
    #import anywhere in its text, in-memory headers, include directories or include flags)
    raises NotKeyed (carrying `compiled`, a binary made already): kjit does not
    guess which files a compile reads (docs/headers.md)."""
    from .includes import header_dependent
    from .snapshot import Snapshot
    req = d.req
    if isinstance(d, Observed):   # its compiles would be observed: these are not
        d = d.unobserved()
    why = header_dependent(req.source, req.options)
    if why is not None:
        exc = NotKeyed(_observer_off_reason(), why)
        exc.compiled = compiled
        raise exc
    d.desc = d.scanned(None)
    return CompileKey(d, key_hash(NAMESPACE, d.desc), Snapshot())


def scanned_key(d: Described) -> str:
    """compile_key's answer for a source that does not compile (so has no observed key):
    the key from kjit's include scan. Never used to store or find a binary."""
    from . import includes
    req, opts = d.req, d.req.options
    res = None
    if includes.may_read_headers(req.source, opts.extra):
        res = includes.resolve(req.source, name=req.name, search=d.path, defines=opts.defines,
                               extra=opts.extra)
    d.desc = d.scanned(res)
    return key_hash(NAMESPACE, d.desc)


def _observer_off_reason() -> str:
    if not switch_on("KJIT_OBSERVE"):
        return "KJIT_OBSERVE=0 turns the compile observer off"
    return _observer().describe()["reason"] or "the compile observer is unavailable"


def _observer() -> Any:
    from . import observe  # a manifest miss only: a disk hit never loads it
    return observe
