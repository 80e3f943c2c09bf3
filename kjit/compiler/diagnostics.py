"""Readable compile errors: the log, the flags, and the source around each line it names."""
from __future__ import annotations

import re
from typing import Any

from ..errors import CompileError

# NVRTC: "name.cu(12): error: ..."; clang/hiprtc: "name.cu:12:5: error: ..."
_LOCATION_RES = (re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\):\s*(?P<sev>error|warning)"),
                 re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):\d+:\s*(?P<sev>error|warning)"))
CONTEXT = 2


def error_lines(log: str, name: str) -> list[int]:
    """Line numbers (1-based) in source `name` that the log reports errors or warnings at."""
    lines: list[int] = []
    for text in log.splitlines():
        for rx in _LOCATION_RES:
            m = rx.match(text.strip())
            file = m.group("file") if m else ""
            # The source itself, not a header whose name merely ends the same way.
            if m and (file == name or file.endswith("/" + name)):
                n = int(m.group("line"))
                if n not in lines:
                    lines.append(n)
    return lines


def excerpt(source: str, line: int, context: int = CONTEXT) -> str:
    src = source.splitlines()
    lo, hi = max(1, line - context), min(len(src), line + context)
    width = len(str(hi))
    out = []
    for n in range(lo, hi + 1):
        mark = ">" if n == line else " "
        out.append(f"  {mark} {n:>{width}} | {src[n - 1]}")
    return "\n".join(out)


def compile_error(message: str, **fields: Any) -> CompileError:
    """A CompileError whose text shows the log, the source lines it points at and the flags."""
    err = CompileError(message, **fields)
    err.report = render_compile_error(err)
    return err


def render_compile_error(err: CompileError) -> str:
    parts = [err.message]
    log = err.log.strip()
    if log:
        parts.append(f"{err.compiler} log:\n" + "\n".join("    " + ln for ln in log.splitlines()))
    if err.source:
        for line in error_lines(err.log, err.name)[:8]:
            parts.append(f"{err.name}, line {line}:\n{excerpt(err.source, line)}")
    if err.options:
        parts.append("options: " + " ".join(err.options))
    return "\n".join(parts)
