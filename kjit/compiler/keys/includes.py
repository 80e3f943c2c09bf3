"""Which headers a compile may read, by scanning its text: for tools (compile_key of a source
that does not compile) and tests. The cache keys compiles by observing the compiler
(observe.py); where it cannot, a compile that may read headers (header_dependent) is not
cached at all, because this scan is a guess: it misses macros defined under #if, digraphs,
comments inside directives, split -X flags, symlinks followed by .., __has_include of a
macro.

The scan follows the search order of include_path.py (in-memory headers, then the including
file's directory for "quoted" names, with the main source's name's directory for the main
source, then the include directories in order, the toolkit's last), ignores #if (a superset
of what was read), and follows `#include MACRO` only through simple `#define MACRO "file.h"`
definitions; anything cleverer raises UnresolvedInclude.

The resolution records a Snapshot (snapshot.py): every file read with its stat data and
hash, every failed lookup with the directory that decided it. Checking the snapshot is how
a remembered key (in process, or in a manifest on disk) is known to still hold without
resolving again. Within one resolution each file is read once; across resolutions a file
whose stat (size, mtime_ns, ctime_ns, inode) is unchanged and not racily clean is not read.
"""
# (no `from __future__ import annotations`: NamedTuples would then compile each field's
# annotation text, and a fresh process's first compile() costs ~1.5 ms of a ~20 ms disk hit)

import functools
import os
import re
import stat as stat_mod
from typing import Any, Mapping, NamedTuple, Sequence

from ...hashing import sha256
from ..include_path import SearchPath, extra_include_dirs
from .description import UnresolvedInclude
from .snapshot import Snapshot, file_sig, is_racy


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """(#include/#import, __has_include, #define NAME <header>), compiled on the first scan:
    a disk hit keyed from a manifest scans nothing, and compiling them costs ~1 ms."""
    return (
        re.compile(r'^[ \t]*#[ \t]*(include_next|include|import)[ \t]*'
                   r'(?:"([^"\n]*)"|<([^>\n]*)>|([A-Za-z_]\w*))', re.M),
        re.compile(r'__has_include(_next)?\s*\(\s*(?:"([^"\n]*)"|<([^>\n]*)>)'),
        re.compile(r'^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(?:"([^"\n]*)"|<([^>\n]*)>)[ \t]*$',
                   re.M))


_PRE_INCLUDE_FLAGS = ("--pre-include=", "-include=")


# Flags through which a compile reads a header or searches a directory: -I, --include-path,
# -include, --pre-include, -isystem... in any spelling (joined, with =, or split).
_HEADER_FLAG = re.compile(r"^-{1,2}(I|include|pre-include|include-path|isystem|system-include|idirafter|iquote)")


def header_dependent(source: str, options: Any) -> "str | None":
    """Why a compile with `options` could read a header file (None: it cannot): its text
    holds "include" or "import" anywhere (every #include, #import, __has_include, %:include,
    a macro named in one: all hold one of these words), or its options add headers or
    include directories."""
    if "include" in source or "import" in source:
        return "the source holds #include, __has_include or #import"
    if options.headers:
        return "in-memory headers are given"
    if options.include_dirs:
        return "include directories are given"
    if any(_HEADER_FLAG.match(f) for f in options.extra):
        return "an include flag is given"
    return None


class Include(NamedTuple):
    name: str
    quoted: bool
    next: bool = False  # include_next


class _Scanned(NamedTuple):
    sha256: str
    includes: tuple[Include, ...]
    macros: dict[str, Include]
    computed: tuple[str, ...]


def scan(text: str, data: bytes | None = None) -> _Scanned:
    """The includes, #define'd header names and computed includes in one file's text (hashed
    as `data`, its bytes, when given)."""
    includes: list[Include] = []
    computed: list[str] = []
    macros: dict[str, Include] = {}
    # Each pattern needs a word the text may not hold at all: a kernel without one compiles
    # no pattern and scans nothing.
    if "include" in text or "import" in text:
        _find_includes(text, includes, computed)
    if "define" in text:
        macros = {m.group(1): Include(m.group(2) if m.group(2) is not None else m.group(3),
                                      m.group(2) is not None) for m in _patterns()[2].finditer(text)}
    if data is None:
        data = text.encode("utf-8", "surrogateescape")
    return _Scanned(sha256(data).hexdigest(), tuple(includes), macros, tuple(computed))


def _find_includes(text: str, includes: list[Include], computed: list[str]) -> None:
    directive_re, has_include_re, _ = _patterns()
    for m in directive_re.finditer(text):
        nxt = m.group(1) == "include_next"
        if m.group(2) is not None:
            includes.append(Include(m.group(2), True, nxt))
        elif m.group(3) is not None:
            includes.append(Include(m.group(3), False, nxt))
        else:
            computed.append(m.group(4))
    for m in has_include_re.finditer(text):  # existence changes the compile: watch it
        includes.append(Include(m.group(2) if m.group(2) is not None else m.group(3),
                                m.group(2) is not None, bool(m.group(1))))


# path -> (stat signature, scanned), for files whose stat was not racy when scanned
_file_memo: dict[str, tuple[tuple[int, int, int, int], _Scanned]] = {}
_text_memo: dict[str, _Scanned] = {}


def _scan_text(text: str) -> _Scanned:
    s = _text_memo.get(text)
    if s is None:
        if len(_text_memo) > 4096:
            _text_memo.clear()
        s = _text_memo[text] = scan(text)
    return s


def _scan_file(path: str, st: os.stat_result, since: float) -> _Scanned:
    sig = file_sig(st)
    memo = _file_memo.get(path)
    if memo is not None and memo[0] == sig:
        return memo[1]
    with open(path, "rb") as f:
        data = f.read()
    scanned = scan(data.decode("utf-8", "surrogateescape"), data)
    if len(_file_memo) > 16384:
        _file_memo.clear()
    if not is_racy(st, since):  # a later write in the same clock tick would keep this stat
        _file_memo[path] = (sig, scanned)
    return scanned


class Resolution:
    """What a compile may read: `deps` in discovery order as (kind, name, sha256) with kind
    "memory" (an in-memory header, by include name) or "file" (absolute path); `missing` the
    include names found nowhere; `snapshot` what to stat to know it still holds."""

    def __init__(self) -> None:
        self.deps: list[tuple[str, str, str]] = []
        self.missing: list[str] = []
        self.snapshot = Snapshot()

    def key(self) -> dict[str, list]:
        return {"headers": [list(d) for d in self.deps], "missing": list(self.missing)}


def pre_includes(extra: Sequence[str]) -> list[str]:
    return [flag.split("=", 1)[1] for flag in extra if flag.startswith(_PRE_INCLUDE_FLAGS)]


def may_read_headers(source: str, extra: Sequence[str] = ()) -> bool:
    """True if the source can read any header at all (a quick test before keying)."""
    # Every #include, #import and __has_include holds one of these words: a text without
    # them reads nothing, and one with them is keyed from its manifest without a scan.
    return "include" in source or "import" in source or bool(pre_includes(extra))


def resolve(source: str, *, name: str, include_dirs: Sequence[str] = (),
            headers: Mapping[str, str] | None = None,
            defines: Sequence[tuple[str, str | None]] = (), extra: Sequence[str] = (),
            search: SearchPath | None = None) -> Resolution:
    """Every header `source` can read, transitively, searching `search` (or, without one,
    `headers` and `include_dirs` plus -I flags in `extra`). Raises UnresolvedInclude for a
    computed include it cannot follow."""
    if search is None:
        dirs = tuple(str(d) for d in include_dirs) + tuple(extra_include_dirs(extra))
        search = SearchPath(dict(headers or {}), dirs, ())
    headers = search.headers
    dirs = list(search.dirs)
    res = Resolution()
    snap = res.snapshot
    since = snap.recorded_at
    macros: dict[str, Include] = {}
    for dname, value in defines:
        if value and len(value) > 2 and value[0] + value[-1] in ('""', "<>"):
            macros[dname] = Include(value[1:-1], value[0] == '"')
    cwd = os.getcwd()
    seen: set[tuple[str, str]] = set()
    missing: set[str] = set()
    dir_cache: dict[str, tuple[str, Any]] = {}
    if search.relative:  # NVRTC resolves a relative -I against the current directory
        snap.cwd = cwd
    roots = [d.rstrip(os.sep) + os.sep for d in dirs]

    from_cwd: set[str] = set()  # includer directories that depend on the current directory

    def base_dir(of_name: str) -> str:
        # NVRTC treats the main source's name (and an in-memory header's) as a path relative
        # to the current directory: "quoted" includes from it start there.
        d = os.path.dirname(os.path.join(cwd, of_name))
        if not os.path.isabs(of_name):
            from_cwd.add(d)
        return d

    def find(inc: Include, includer_dir: str | None, includer_root: int | None):
        if inc.name in headers:
            return ("memory", inc.name)
        if os.path.isabs(inc.name):
            candidates = [inc.name]
        else:
            search_dirs: list[str] = []
            if inc.quoted and includer_dir is not None and not inc.next:
                search_dirs.append(includer_dir)
                if includer_dir in from_cwd:
                    snap.cwd = cwd
            start = includer_root + 1 if inc.next and includer_root is not None else 0
            search_dirs += dirs[start:]
            candidates = [os.path.normpath(os.path.join(d, inc.name)) for d in search_dirs]
        for cand in candidates:
            try:
                st = os.stat(cand)
            except OSError:
                snap.add_absent(cand, dir_cache)
                continue
            if stat_mod.S_ISREG(st.st_mode):
                return ("file", cand, st)
            snap.add_absent(cand, dir_cache)
        return None

    def root_of(path: str) -> int | None:
        for i, r in enumerate(roots):
            if path.startswith(r):
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
                sub = _scan_file(path, st, since)
                snap.add_file(path, st, sub.sha256)
                res.deps.append(("file", path, sub.sha256))
                visit(sub, os.path.dirname(path), root_of(path))

    main = scan(source) if len(source) > 1 << 16 else _scan_text(source)
    pre = tuple(Include(p, True) for p in pre_includes(extra))
    visit(_Scanned(main.sha256, pre + main.includes, main.macros, main.computed),
          base_dir(name), None)
    return res
