"""Kept sources: the text of kernels compiled with line or debug information, kept in the
cache directory at the path their binaries' line tables name, so cuda-gdb, Nsight Compute
and anything else that opens the file shows the user's lines (docs/debugging.md).

Layout: <cache dir>/sources/<sha256 of the text>/<the name, made relative>. A file there is
named by its content, so it is written once, read-only, and never changes: a binary that
names it shows the lines it was compiled from, wherever and whenever it is loaded.

Files are small (the source text) and not counted against KJIT_CACHE_SIZE: `kjit cache
prune` removes those no entry names any more, `kjit cache clear` removes them all, and a
cache hit writes its file again if it is gone.
"""
from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Iterable

from .key import sha256

SUBDIR = "sources"
DEFAULT_NAME = "kernel.cu"
# prune leaves files younger than this: a compile writes its source before it stores its entry
MIN_AGE_S = 3600.0
# this process's writes and failures (`kjit cache stats`: "sources")
counts = {"written": 0, "failed": 0}


def relative(name: str) -> str:
    """`name` as a path below a digest's directory: its components without "", "." or ".."
    (an absolute name keeps its directories, so a debugger still shows where it came from)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(parts) or DEFAULT_NAME


def file_in(sources_dir: str, text: str, name: str) -> str:
    """Where `text`, compiled under `name`, is kept below `sources_dir`."""
    return os.path.join(sources_dir, sha256(text), relative(name))


def holds(path: str, size: int) -> bool:
    """Whether `path` is a regular file of `size` bytes (named by its content, it then holds
    that content)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def ensure(sources_dir: str, text: str, name: str, path: str | None = None) -> OSError | None:
    """Make sure `text`, compiled under `name`, is kept below `sources_dir` (written if its
    file is missing or of another size; `path`: its file_in, if known). Never raises: what
    stopped the write is returned (and counted), for the caller to say."""
    path = path or file_in(sources_dir, text, name)
    try:
        data = text.encode()
        if holds(path, len(data)):
            with contextlib.suppress(OSError):   # in use again: too new for prune to take
                os.utime(path)
            return None
        _write(Path(sources_dir), Path(path), data)
        counts["written"] += 1
        return None
    except (OSError, UnicodeError, ValueError) as exc:
        counts["failed"] += 1
        return exc if isinstance(exc, OSError) else OSError(str(exc))


def _write(root: Path, path: Path, data: bytes) -> None:
    """Write `data` to `path` below `root` (<cache>/sources) as a new read-only file renamed
    into place: a reader never sees half a file, and processes writing the same text at
    once write the same bytes."""
    from . import trust
    cache = root.parent
    if not cache.is_dir():   # made private, as the disk store makes it
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(cache, 0o700)
    trust.check_directory(cache)   # never write into another user's cache, or through a link
    # each level private: a group-writable one (umask 002) would make the cache untrusted
    for d in [root, *reversed(path.parent.relative_to(root).parents[:-1]), path.parent.relative_to(root)]:
        d = d if d.is_absolute() else root / d
        if not d.is_dir():
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o444)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _files(root: Path) -> Iterable[Path]:
    """The regular files below `root`, links neither followed nor listed."""
    for dirpath, dirnames, filenames in os.walk(root):
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                yield p


def prune(cache: Path, named: set[str], now: float | None = None) -> int:
    """Remove the kept sources below cache directory `cache` that no entry names (`named`:
    absolute paths) and that are older than MIN_AGE_S, then the directories left empty.
    Returns how many files went."""
    root = Path(os.path.abspath(cache)) / SUBDIR   # as the entries name them
    if root.is_symlink() or not root.is_dir():
        return 0
    now = time.time() if now is None else now
    removed = 0
    for p in list(_files(root)):
        try:
            if str(p) in named or now - p.lstat().st_mtime < MIN_AGE_S:
                continue
            p.unlink()
            removed += 1
        except OSError:
            continue
    for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        if dirpath != str(root):
            try:
                os.rmdir(dirpath)   # only an empty one goes
            except OSError:
                pass
    return removed


def named_by(metas: Iterable[dict]) -> set[str]:
    """The kept sources that entries' metadata name."""
    return {p for m in metas for p in (m.get("kept_sources") or ()) if isinstance(p, str)}


def clear(cache: Path) -> None:
    """Remove every kept source of cache directory `cache` (a link there is removed, never
    followed)."""
    import shutil
    root = cache / SUBDIR
    if root.is_symlink():
        root.unlink()
    elif root.is_dir():
        shutil.rmtree(root, ignore_errors=True)


def volume(cache: Path) -> tuple[int, int]:
    """(files, bytes) of the kept sources of cache directory `cache`."""
    n = size = 0
    root = cache / SUBDIR
    if root.is_dir() and not root.is_symlink():
        for p in _files(root):
            try:
                size += p.lstat().st_size
                n += 1
            except OSError:
                pass
    return n, size
