"""kjit.compile_many: many compiles, the cache's hits at once, the misses in parallel.

Each item is asked of the cache in this process first, exactly as kjit.compile asks it,
with a hook that defers the compile instead of running it (cached.before_compile). Hits are returned as they are; the
misses go to the worker processes of kjit.compiler.pool, which run kjit.compile themselves
and so store their results in the shared disk cache under the per-key locks. One miss (or
jobs=1) compiles here: a single compile never pays for starting a worker.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Mapping

from ..errors import CompileError, InvalidOptionError, KjitError
from ..progress import Bar
from . import pool as pool_mod

class Deferred(BaseException):
    """Raised instead of compiling by the hook _probe installs: the cache was asked here,
    the compile goes to a worker process. A BaseException, so no `except Exception` on the
    way takes it for a failed compile."""


def _defer() -> None:
    raise Deferred()


ITEM_KEYS = ("source", "arch", "target", "options", "name_expressions", "backend", "name", "cache")
ERRORS = ("raise", "return")
BAR_AFTER_S = 2.0   # a progress bar only for batches that take longer than this


def compile_many(sources: Iterable[Any], *, arch: Any = None, target: str | None = None,
                 options: Any = None, name_expressions: Iterable[str] = (),
                 backend: str = "cuda", name: str | None = None, cache: bool = True,
                 jobs: int | None = None, errors: str = "raise",
                 progress: bool | Callable[[int, int], Any] | None = None,
                 on_result: Callable[[int, Any], Any] | None = None) -> list:
    """Compile many sources; returns one ObjectCode per item, in the order given.

    sources: source strings, or dicts holding "source" and any of arch, target, options,
    name_expressions, backend, name, cache for that item; the keyword arguments are the
    defaults for every item. Bad arguments raise InvalidOptionError (naming the item) before
    anything compiles.
    jobs: worker processes for the misses (default $KJIT_COMPILE_JOBS, else the cores this
    process may run on); 1 compiles everything in this process. Workers stay
    $KJIT_COMPILE_POOL_IDLE seconds (default 30) for the next batch and end with this process.
    errors: "raise" (default) compiles every item, then raises the first failing item's
    error (CompileError...); "return" puts each failing item's exception in its place. A
    worker that dies (a signal) fails the item it held, with a KjitError naming the item and
    the signal (pool.WorkerDied); the other items still compile.
    progress: None shows a bar on a terminal (stderr) once a batch has run 2 s; False
    never, True always on a terminal; a callable gets (done, total) after each item.
    on_result: a callable given (index, ObjectCode or exception) as each item finishes, in
    the order they finish (cache hits first), from the calling thread or a worker's serving
    thread: the autotuner times one candidate while the next ones compile.
    """
    if errors not in ERRORS:
        raise InvalidOptionError(f"errors={errors!r} is not one of {', '.join(map(repr, ERRORS))}")
    common = {"arch": arch, "target": target, "options": options,
              "name_expressions": name_expressions, "backend": backend, "name": name, "cache": cache}
    items = [_item(i, it, common) for i, it in enumerate(_listed(sources))]
    size = pool_mod.pool_size(jobs)
    results: list[Any] = [None] * len(items)
    tracker = _Progress(len(items), progress, on_result, results)
    tracker.start()
    try:
        _run(items, results, size, tracker)
    finally:
        tracker.close()
    if tracker.callback_error is not None:   # a serving thread would have lost it
        raise tracker.callback_error
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failed and errors == "raise":
        exc = results[failed[0]]
        if len(failed) > 1:
            exc.add_note(f"{len(failed) - 1} more of the {len(items)} items failed too "
                         f"(items {failed[1:11]}); errors='return' gives each its own error")
        raise exc
    return results


def _listed(sources: Any) -> list:
    if isinstance(sources, (str, bytes, Mapping)):
        raise InvalidOptionError("compile_many takes a list of sources (or of dicts); "
                                 "for one source use kjit.compile")
    try:
        return list(sources)
    except TypeError:
        raise InvalidOptionError(f"compile_many takes a list of sources, got "
                                 f"{type(sources).__name__}") from None


def _item(i: int, it: Any, common: dict) -> tuple[dict, Any]:
    """(kjit.compile's keyword arguments, validated request) for item i; the arguments carry
    the request, so kjit.compile does not validate them again."""
    from .request import make_request
    if isinstance(it, Mapping):
        unknown = sorted(set(map(str, it)) - set(ITEM_KEYS))
        if unknown or "source" not in it:
            what = f"unknown keys {unknown}" if unknown else "no 'source'"
            raise InvalidOptionError(f"compile_many item {i}: {what}; an item's keys are "
                                     f"{', '.join(ITEM_KEYS)}")
        kw = dict(common, **it)
    else:
        kw = dict(common, source=it)
    if not isinstance(kw["name_expressions"], (tuple, str)):
        kw["name_expressions"] = tuple(kw["name_expressions"])
    try:
        req = make_request(kw["source"], arch=kw["arch"], target=kw["target"], options=kw["options"],
                           name_expressions=kw["name_expressions"], backend=kw["backend"],
                           name=kw["name"])
    except InvalidOptionError as exc:
        raise InvalidOptionError(f"compile_many item {i}: {exc}") from None
    kw["arch"] = req.arch   # the device's arch resolved once; the rest as given, as kjit.compile memoises it
    kw["_request"] = req
    return kw, req


def _probe(kw: dict) -> Any:
    """The cache's answer for one item, or None on a miss (nothing compiled here)."""
    from .cached import before_compile, compile as kjit_compile
    if kw["backend"] != "cuda":
        return None   # HIP items go to the workers, which ask the cache
    token = before_compile.set(_defer)
    try:
        return kjit_compile(**kw)
    except Deferred:
        return None
    except KjitError as exc:
        return exc
    finally:
        before_compile.reset(token)


def _here(kw: dict) -> Any:
    from .cached import compile as kjit_compile
    try:
        return kjit_compile(**kw)
    except KjitError as exc:
        return exc


def _run(items: list, results: list, size: int, tracker: "_Progress") -> None:
    jobs: "queue.Queue[tuple[int, str] | None]" = queue.Queue()
    misses: list[int] = []
    threads: list[threading.Thread] = []

    def on_reply(i: int, reply: Any) -> None:
        results[i] = pool_mod.from_reply(reply, items[i][1]) if isinstance(reply, dict) else reply
        tracker.done(miss=True, index=i)

    groups = _prologue_groups(items, size)
    held: list[int] = []

    def send(i: int) -> None:
        if groups[i] is not None:  # sent below, one prologue after another
            held.append(i)
            return
        jobs.put((i, _request(items[i])))

    try:
        for i, (kw, _) in enumerate(items):
            found = _probe(kw)
            if found is not None:
                results[i] = found
                tracker.done(miss=False, index=i)
                continue
            misses.append(i)
            if size == 1:
                results[i] = _here(kw)
                tracker.done(miss=True, index=i)
            elif len(misses) == 2:   # the second miss: now the pool pays
                threads = pool_mod.shared_pool().run(jobs, min(size, len(items) - misses[0]),
                                                     on_reply)
                send(misses[0])
                send(i)
            elif len(misses) > 2:
                send(i)
        if size > 1 and len(misses) == 1:
            results[misses[0]] = _here(items[misses[0]][0])
            tracker.done(miss=True, index=misses[0])
        # misses that share a prologue, grouped: each worker then meets one prologue after
        # another, told that more of it follow, so its precompiled header pays from its first
        import json
        from collections import Counter
        missed = Counter(groups[i] for i in held)
        for i in sorted(held, key=lambda i: (groups[i], i)):
            repeat = missed[groups[i]] >= 2 * len(threads)
            jobs.put((i, json.dumps(dict(json.loads(_request(items[i])), pch_repeat=repeat))))
    finally:
        jobs.put(None)   # the serving threads end once the queue is drained
        for t in threads:
            t.join()


def _request(item: tuple[dict, Any]) -> str:
    kw, req = item
    return pool_mod.request_line(req, kw["cache"])


def _prologue_groups(items: list, size: int) -> list[str | None]:
    """Per item: its include prologue and options, where enough items share them that each
    worker will likely compile two or more (a precompiled header then pays from a worker's
    first one: compiler/pch.py); else None."""
    workers = max(1, min(size, len(items)))
    if size == 1 or len(items) < 2 * workers:   # no group can give each worker two
        return [None] * len(items)
    from collections import Counter
    from .pch import prologue
    groups = []
    for kw, req in items:
        text = prologue(req.source) if req.backend == "cuda" else None
        groups.append(None if text is None else _request((kw, req._replace(source=text))))
    counts = Counter(g for g in groups if g is not None)
    return [g if g is not None and counts[g] >= 2 * workers else None for g in groups]


class _Progress:
    """Counts finished items for a callable, or advances the bar (kjit.progress) that appears
    on a terminal once the batch has run BAR_AFTER_S."""

    def __init__(self, total: int, progress: Any, on_result: Any = None,
                 results: list | None = None):
        self.total, self.count, self.progress = total, 0, progress
        self.on_result, self.results = on_result, results
        self.callback_error: BaseException | None = None
        self.lock = threading.Lock()
        # True shows it at once, still only on a terminal; a callable draws none
        self.bar = Bar(total, "kjit: compiling", min_total=1,
                       show=False if progress is False or callable(progress) else None,
                       after_s=BAR_AFTER_S if progress is None else 0.0)

    def start(self) -> None:
        self.bar.start()

    def done(self, miss: bool, index: int | None = None) -> None:
        if self.on_result is not None and index is not None:
            try:   # outside the lock: it may take a while
                self.on_result(index, self.results[index])
            except BaseException as exc:   # raised by compile_many once every item is done
                with self.lock:
                    self.callback_error = self.callback_error or exc
        with self.lock:
            self.count += 1
            if callable(self.progress):
                self.progress(self.count, self.total)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


__all__ = ["compile_many", "CompileError"]
