"""A source's include prologue: the directives before its first declaration, where NVRTC's
precompiled header (compiler/pch.py) stops; and whether a log speaks only of what follows it."""
from __future__ import annotations

import functools

_SKIP = r"(?:\s+|//[^\n]*|/\*.*?\*/)+"                          # blanks and comments
_DIRECTIVE = r"(?:#|%:)(?:[^\n\\/]|\\.|\\\n|/\*.*?\*/|/(?![*]))*"  # to its line's end
_WORD = r"(?:#|%:)(?:\s|/\*.*?\*/)*(\w+)"


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple:
    """Compiled on a process's first miss, not at import (a disk hit never imports this)."""
    import re
    return tuple(re.compile(p, re.S) for p in (_SKIP, _DIRECTIVE, _WORD))


def prologue(source: str) -> str | None:
    """The source up to the end of its last leading preprocessor directive (NVRTC's header
    stop is the first token after them), or None where it includes nothing or stops inside
    an #if (NVRTC would not build a PCH there)."""
    if "include" not in source:  # most small kernels: no scan (and no regex compiled)
        return None
    skip, directive, word_re = _patterns()
    pos, end, depth, includes = 0, 0, 0, False
    n = len(source)
    while pos < n:
        m = skip.match(source, pos)
        if m:
            pos = m.end()
            continue
        d = directive.match(source, pos)
        if d is None:  # each directive runs to its line's end: every # here starts a line
            break
        word = word_re.match(source, pos)
        kind = word.group(1) if word else ""
        if kind in ("if", "ifdef", "ifndef"):
            depth += 1
        elif kind == "endif":
            depth -= 1
        elif kind in ("include", "include_next"):
            includes = True
        pos = d.end()
        end = pos
    if not includes or depth != 0:
        return None
    return source[:end] + "\n"


def past_prologue(log: str, name: str, lines: int) -> bool:
    """Whether every diagnostic in the log points past the prologue's `lines` lines of the
    source `name` (an error in the kernel being edited), so that a compile using the PCH
    would say the same; a header's warning, or anything else, is not."""
    if not log.strip():
        return True
    import re
    found = False
    for line in log.splitlines():
        m = re.match(r"(.+?)\((\d+)\): (?:error|warning|remark|catastrophic error)", line)
        if m:
            if m.group(1) != name or int(m.group(2)) <= lines:
                return False
            found = True
        elif "warning" in line.lower() and "detected in the compilation" not in line:
            return False
    return found
