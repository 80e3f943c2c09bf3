"""Precompiled headers kept in the cache directory (kjit/compiler/pch.py makes and uses them):
where they are, what they take of the cache's size cap, their LRU order, their removal.

Layout, in `<cache dir>/pch/`:
  <key>.json          a PCH's record (compiler/pch_store.py: a CRC line, then the JSON naming
                      its file and the Snapshot of the files its build read); its mtime is the
                      PCH's last use (touched at each use: the .pch itself never changes)
  <key>-<token>.pch   NVRTC's file, written under a temporary name and renamed into place
                      (NVRTC maps it MAP_PRIVATE: it is never rewritten, only unlinked)
  <key>.seen          a prologue compiled once without a PCH: its next compile builds one
  <key>.building      the pid of the process building that PCH now (compiler/pch_store.py:
                      other processes wait for it rather than build their own)
  *.tmp               being written; one left by a killed process goes after an hour

Each record with its file(s) is one item of the cache's LRU (DiskStore.evict_lru orders them
with the entries by last use), counted by its bytes on disk. A .pch no record names (its
writer died, or lost a race to another writer) is an item too once it is a minute old, with
its own mtime as its last use: it goes first. Removal is an unlink: a process mapping the
file keeps its pages.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

SUBDIR = "pch"
ORPHAN_S = 60.0        # a .pch no record names, older than this, is a leftover
TMP_S = 3600.0         # a temporary file older than this was left by a killed process


class Item(NamedTuple):
    stem: str
    used: float
    bytes: int
    paths: tuple[Path, ...]


def directory(base: Path) -> Path:
    return base / SUBDIR


def _size(st: os.stat_result) -> int:
    """Bytes a file takes on disk (a PCH is dense, but a sparse leftover counts as little)."""
    return min(st.st_size, st.st_blocks * 512) if st.st_blocks else st.st_size


def items(base: Path) -> list[Item]:
    """The PCHs (with their records) in the cache directory `base`, oldest use first."""
    d = directory(base)
    try:
        if d.is_symlink() or not d.is_dir():
            return []
        names = os.listdir(d)
    except OSError:
        return []
    stats: dict[str, os.stat_result] = {}
    for n in names:
        try:
            st = os.lstat(d / n)
        except OSError:
            continue
        if not os.path.isdir(d / n) or os.path.islink(d / n):
            stats[n] = st
    now = time.time()
    records = {n[:-5] for n in stats if n.endswith(".json")}
    groups: dict[str, list[str]] = {k: [k + ".json"] for k in records}
    out = []
    for n, st in stats.items():
        if n.endswith(".pch"):
            stem = n[:-4].rsplit("-", 1)[0]
            if stem in groups:
                groups[stem].append(n)
            elif now - st.st_mtime > ORPHAN_S:
                out.append(Item(n[:-4], st.st_mtime - 1e9, _size(st), (d / n,)))
        elif n.endswith(".tmp") and now - st.st_mtime > TMP_S:
            out.append(Item(n, st.st_mtime - 1e9, _size(st), (d / n,)))
        elif n.endswith(".seen"):
            groups.setdefault(n[:-5] if n[:-5] in records else "seen:" + n[:-5], []).append(n)
    for stem, files in groups.items():
        used = stats[files[0]].st_mtime
        out.append(Item(stem, used, sum(_size(stats[f]) for f in files),
                        tuple(d / f for f in files)))
    out.sort(key=lambda i: i.used)
    return out


def volume(base: Path) -> tuple[int, int]:
    """(PCH files, bytes they and their records take) in the cache directory `base`."""
    found = items(base)
    return sum(1 for i in found for p in i.paths if p.suffix == ".pch"), sum(i.bytes for i in found)


def remove(item: Item) -> None:
    """Unlink an item's files (a process mapping one keeps its pages)."""
    for p in item.paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def clear(base: Path) -> int:
    """Remove every PCH, record and marker in the cache directory `base`; returns the number
    of PCH files removed."""
    d = directory(base)
    if d.is_symlink() or not d.is_dir():
        return 0
    n = 0
    for f in d.iterdir():
        if f.is_symlink() or f.is_file():
            try:
                f.unlink()   # never follows a link
                n += f.suffix == ".pch"
            except OSError:
                pass
    return n


def older_than(base: Path, cutoff: float) -> list[Item]:
    return [i for i in items(base) if i.used < cutoff]
