"""Shared by the observed-key tests: a kernel whose constant comes from a header, and a
way to read that constant back from the PTX."""
from __future__ import annotations

import re
import time
from pathlib import Path

import kjit
from kjit.compiler.keys import snapshot

KERNEL = 'extern "C" __global__ void k(int* p) { *p = VAL; }\n'


def settle() -> None:
    """As between an edit and a compile: past the file system's timestamp tick."""
    time.sleep(snapshot.timestamp_granularity())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    settle()
    return path


def val(obj) -> int:
    """The constant the kernel stores, read from its PTX."""
    m = re.search(rb"mov\.u32\s+%r\d+,\s*(\d+);", obj.code)
    assert m, obj.code.decode()
    return int(m.group(1))


def ptx(src: str, **opts):
    return kjit.compile(src, arch="sm_80", target="ptx", options=kjit.CompileOptions(**opts))


def edit_and_check(src: str, header: Path, **opts) -> None:
    """The constant follows the header through edits, and an unchanged header is a hit."""
    write(header, "#define VAL 1111111\n")
    a = ptx(src, **opts)
    assert val(a) == 1111111
    assert ptx(src, **opts).cache_hit is True
    write(header, "#define VAL 2222222\n")
    b = ptx(src, **opts)
    assert val(b) == 2222222 and b.cache_hit is False
    assert ptx(src, **opts).cache_hit is True
    write(header, "#define VAL 1111111\n")
    assert val(ptx(src, **opts)) == 1111111
