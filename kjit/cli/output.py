"""Where a command's `-o` output goes (compile, build, link).

As compilers do: a regular file is replaced whole, a symbolic link's target is written,
/dev/null, a FIFO or a terminal is written through and never replaced (kjit.fileio),
`-o -` writes the bytes to standard output for a pipe, a write error (ENOSPC on
/dev/full, a closed pipe) is an error with exit 1, and an output naming one of the
inputs is refused before anything runs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

import click

from ..errors import KjitError

STDOUT = "-"


class OutputError(KjitError):
    """The output could not be written."""


def check(output: str | os.PathLike[str] | None, inputs: Sequence[str | os.PathLike[str]],
          as_json: bool = False) -> None:
    """UsageError for an output that is one of the inputs, or `-o -` with --json (both
    would write to standard output)."""
    if output is None:
        return
    if str(output) == STDOUT:
        if as_json:
            raise click.UsageError("-o - and --json both write to standard output: use one")
        return
    for i in inputs:
        if same_file(output, i):
            raise click.UsageError(f"the output {output} is one of the inputs ({i}): writing it "
                                   "would destroy that input; choose another output with -o")


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two names are one file (through links, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def write(obj: Any, output: str | os.PathLike[str], *, make_dirs: bool = False,
          sidecar: bool = False) -> str:
    """Write an ObjectCode to `output` (STDOUT: standard output), with its `.kjit.json`
    sidecar only if `sidecar`; returns what to call it in messages. OutputError says what
    failed."""
    if str(output) == STDOUT:
        stream = sys.stdout.buffer
        try:
            stream.write(obj.code)
            stream.flush()
        except OSError as exc:
            raise OutputError(f"cannot write to standard output: {exc.strerror or exc}") from None
        return "<stdout>"
    path = Path(output)
    try:
        if make_dirs and not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        obj.save(path, sidecar=sidecar)
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror or exc}") from None
    return str(output)


def summary_to_stderr(output: str | os.PathLike[str] | None) -> bool:
    """Whether the text summary must go to stderr (the bytes are on stdout)."""
    return output is not None and str(output) == STDOUT
