"""Which headers a compile reads, with their contents' hashes, for the cache key.

Why resolve includes ourselves rather than read NVRTC's --fdevice-time-trace
("Processing Header File" events): the trace is only known *after* a compile, so a key built
from it needs a manifest from an earlier compile (ccache's "direct mode"), and such a manifest
cannot see a header that appears later in an earlier include directory and shadows the one
recorded - a stale binary. Resolving here, on every key derivation, follows NVRTC's search
order (in-memory headers, then the including file's directory for "quoted" names, with the
current directory for the main source, then -I directories in order) and so sees shadowing,
new files and edits at any depth. It ignores #if, so it may hash a header the compile skips:
the key covers a superset of what was read - an extra miss at worst, never a stale hit.
Names found nowhere are NVRTC's built-in headers (covered by the compiler version in the key)
or errors; their absence is watched too. `#include MACRO` is followed through simple
`#define MACRO "file.h"` / `<file.h>` definitions; anything cleverer raises
UnresolvedInclude and the compile runs uncached rather than risk a wrong key.

Speed: every file's (mtime_ns, size, inode) is remembered with its hash and its includes, so
an unchanged tree costs one stat per header and per searched directory; a `touch` re-hashes
and finds the same content (a hit). A file modified within RACY_S of when it was hashed is not
trusted by its stat (coarse file-system clocks, as git's "racily clean" rule) and is re-read.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat as stat_mod
import time
from typing import Mapping, NamedTuple, Sequence

RACY_S = 2.0

_DIRECTIVE_RE = re.compile(
    r'^[ \t]*#[ \t]*(include_next|include|import)[ \t]*(?:"([^"\n]*)"|<([^>\n]*)>|([A-Za-z_]\w*))',
    re.M)
_HAS_INCLUDE_RE = re.compile(r'__has_include(_next)?\s*\(\s*(?:"([^"\n]*)"|<([^>\n]*)>)')
_DEFINE_RE = re.compile(r'^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(?:"([^"\n]*)"|<([^>\n]*)>)[ \t]*$',
                        re.M)
_PRE_INCLUDE_FLAGS = ("--pre-include=", "-include=")
_INCLUDE_PATH_FLAGS = ("--include-path=", "-I")


class UnresolvedInclude(Exception):
    """An #include whose target kjit cannot work out (a computed include)."""


class Include(NamedTuple):
    name: str
    quoted: bool
    next: bool = False  # include_next


class _Scanned(NamedTuple):
    sha256: str
    includes: tuple[Include, ...]
    macros: dict[str, Include]
    computed: tuple[str, ...]


def scan(text: str) -> _Scanned:
    """The includes, #define'd header names and computed includes in one file's text."""
    includes: list[Include] = []
    computed: list[str] = []
    for m in _DIRECTIVE_RE.finditer(text):
        nxt = m.group(1) == "include_next"
        if m.group(2) is not None:
            includes.append(Include(m.group(2), True, nxt))
        elif m.group(3) is not None:
            includes.append(Include(m.group(3), False, nxt))
        else:
            computed.append(m.group(4))
    for m in _HAS_INCLUDE_RE.finditer(text):  # existence changes the compile: watch it
        includes.append(Include(m.group(2) if m.group(2) is not None else m.group(3),
                                m.group(2) is not None, bool(m.group(1))))
    macros = {m.group(1): Include(m.group(2) if m.group(2) is not None else m.group(3),
                                  m.group(2) is not None) for m in _DEFINE_RE.finditer(text)}
    return _Scanned(hashlib.sha256(text.encode()).hexdigest(), tuple(includes), macros,
                    tuple(computed))


# path -> (stat signature, hashed_at, scanned)
_file_memo: dict[str, tuple[tuple[int, int, int], float, _Scanned]] = {}
_text_memo: dict[str, _Scanned] = {}


def _scan_text(text: str) -> _Scanned:
    s = _text_memo.get(text)
    if s is None:
        if len(_text_memo) > 4096:
            _text_memo.clear()
        s = _text_memo[text] = scan(text)
    return s


def _sig(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _scan_file(path: str, st: os.stat_result) -> _Scanned:
    sig = _sig(st)
    memo = _file_memo.get(path)
    if memo is not None and memo[0] == sig and memo[1] - st.st_mtime_ns / 1e9 > RACY_S:
        return memo[2]
    now = time.time()
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "surrogateescape")
    scanned = scan(text)
    if len(_file_memo) > 16384:
        _file_memo.clear()
    _file_memo[path] = (sig, now, scanned)
    return scanned


class Resolution:
    """What a compile may read: `deps` in discovery order as (kind, name, sha256) with kind
    "memory" (an in-memory header, by include name) or "file" (absolute path); `missing` the
    include names found nowhere; and what to stat to know it still holds."""

    def __init__(self) -> None:
        self.deps: list[tuple[str, str, str]] = []
        self.missing: list[str] = []
        self.files: dict[str, tuple[int, int, int]] = {}
        self.dirs: dict[str, tuple[int, int] | None] = {}
        self.cwd: str | None = None
        self.stable = True
        self.created = time.time()

    def key(self) -> dict[str, list]:
        return {"headers": [list(d) for d in self.deps], "missing": list(self.missing)}

    def still_valid(self) -> bool:
        """True if nothing it depends on changed: each file's and searched directory's stat,
        and the current directory where the main source's quoted includes start."""
        if not self.stable:
            return False
        if self.cwd is not None and os.getcwd() != self.cwd:
            return False
        stat = os.stat
        try:
            for path, sig in self.files.items():
                st = stat(path)
                if (st.st_mtime_ns, st.st_size, st.st_ino) != sig:
                    return False
        except OSError:
            return False
        for d, dsig in self.dirs.items():
            try:
                st = stat(d)
            except OSError:
                if dsig is not None:
                    return False
                continue
            if dsig is None or (st.st_mtime_ns, st.st_ino) != dsig:
                return False
        return True


def extra_include_dirs(extra: Sequence[str]) -> list[str]:
    out = []
    for flag in extra:
        for prefix in _INCLUDE_PATH_FLAGS:
            if flag.startswith(prefix) and len(flag) > len(prefix):
                out.append(os.path.abspath(flag[len(prefix):]))
    return out


def pre_includes(extra: Sequence[str]) -> list[str]:
    return [flag.split("=", 1)[1] for flag in extra if flag.startswith(_PRE_INCLUDE_FLAGS)]


def resolve(source: str, *, name: str, include_dirs: Sequence[str],
            headers: Mapping[str, str], defines: Sequence[tuple[str, str | None]] = (),
            extra: Sequence[str] = ()) -> Resolution:
    """Every header `source` can read, transitively. Raises UnresolvedInclude for a computed
    include it cannot follow."""
    res = Resolution()
    dirs = [str(d) for d in include_dirs] + extra_include_dirs(extra)
    macros: dict[str, Include] = {}
    for dname, value in defines:
        if value and len(value) > 2 and value[0] + value[-1] in ('""', "<>"):
            macros[dname] = Include(value[1:-1], value[0] == '"')
    now = time.time()
    cwd = os.getcwd()
    seen: set[tuple[str, str]] = set()
    missing: set[str] = set()

    def base_dir(of_name: str) -> str:
        # NVRTC treats the main source's name (and an in-memory header's) as a path relative
        # to the current directory: "quoted" includes from it start there.
        res.cwd = cwd if not os.path.isabs(of_name) else res.cwd
        return os.path.dirname(os.path.join(cwd, of_name))

    def watch_dir(d: str) -> None:
        if d in res.dirs:
            return
        try:
            st = os.stat(d)
        except OSError:
            res.dirs[d] = None
            parent = os.path.dirname(d)
            if parent and parent != d:
                watch_dir(parent)  # its creation changes the parent's mtime
            return
        res.dirs[d] = (st.st_mtime_ns, st.st_ino)
        if now - st.st_mtime_ns / 1e9 <= RACY_S:
            res.stable = False

    def find(inc: Include, includer_dir: str | None, includer_root: int | None):
        if inc.name in headers:
            return ("memory", inc.name)
        if os.path.isabs(inc.name):
            candidates = [inc.name]
        else:
            search: list[str] = []
            if inc.quoted and includer_dir is not None and not inc.next:
                search.append(includer_dir)
            start = includer_root + 1 if inc.next and includer_root is not None else 0
            search += dirs[start:]
            candidates = [os.path.normpath(os.path.join(d, inc.name)) for d in search]
        for cand in candidates:
            try:
                st = os.stat(cand)
            except OSError:
                watch_dir(os.path.dirname(cand))
                continue
            if stat_mod.S_ISREG(st.st_mode):
                return ("file", cand, st)
            watch_dir(os.path.dirname(cand))
        return None

    def root_of(path: str) -> int | None:
        for i, d in enumerate(dirs):
            if path.startswith(d.rstrip(os.sep) + os.sep):
                return i
        return None

    def visit(scanned: _Scanned, includer_dir: str | None, includer_root: int | None) -> None:
        macros.update(scanned.macros)
        todo = list(scanned.includes)
        for mname in scanned.computed:
            if mname not in macros:
                raise UnresolvedInclude(
                    f"#include {mname}: kjit cannot tell which header this macro names, so it "
                    "cannot key the cache on it")
            todo.append(macros[mname])
        for inc in todo:
            found = find(inc, includer_dir, includer_root)
            if found is None:
                if inc.name not in missing:
                    missing.add(inc.name)
                    res.missing.append(inc.name)
                continue
            if found[0] == "memory":
                ident = ("memory", found[1])
                if ident in seen:
                    continue
                seen.add(ident)
                sub = _scan_text(headers[found[1]])
                res.deps.append(("memory", found[1], sub.sha256))
                visit(sub, base_dir(found[1]), None)
            else:
                _, path, st = found
                ident = ("file", path)
                if ident in seen:
                    continue
                seen.add(ident)
                sub = _scan_file(path, st)
                res.files[path] = _sig(st)
                if now - st.st_mtime_ns / 1e9 <= RACY_S:
                    res.stable = False
                res.deps.append(("file", path, sub.sha256))
                visit(sub, os.path.dirname(path), root_of(path))

    main = scan(source) if len(source) > 1 << 16 else _scan_text(source)
    pre = tuple(Include(p, True) for p in pre_includes(extra))
    visit(_Scanned(main.sha256, pre + main.includes, main.macros, main.computed),
          base_dir(name), None)
    return res
