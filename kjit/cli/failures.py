"""How a failed `kjit` command ends, for people and for scripts (docs/cli.md).

Without --json: a message on stderr. With --json: one JSON object on stdout,
{"error": {"type": ..., "message": ..., "exit_code": ...}} (plus the compiler's or
linker's log where there is one, and the warnings), so a script can parse every outcome.
Exit codes: 0 success, 1 the command failed (bad input, compile or link error, cache
problem; also running out of memory, type "OutOfMemory", with what to do), 2 the command
line or a KJIT_* setting is wrong (type "UsageError" whatever click called it), 70 an
internal error in kjit (with a traceback on stderr), 130 interrupted.
"""
from __future__ import annotations

import contextlib
import json
import sys
import traceback
import warnings
from typing import Any, Iterator, Sequence

import click

from ..errors import KjitError

EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 70, 130
OUT_OF_MEMORY = ("out of memory: the command needed more memory than this process may use (an "
                 "address-space or memory limit: `ulimit -v`, a container's or a batch job's); "
                 "raise the limit, or give the command fewer or smaller inputs (kjit build: "
                 "fewer --jobs)")


class CommandFailed(click.ClickException):
    """A KjitError on its way out of a command: click's error that keeps the original."""

    def __init__(self, original: BaseException, message: str | None = None):
        super().__init__(message if message is not None else str(original))
        self.original = original


_seen: list[str] = []   # this command's warnings, for its --json object


def with_warnings(data: Any) -> Any:
    """A --json object with the command's warnings added as "warnings" (a list), if any."""
    if isinstance(data, dict) and _seen:
        return {**data, "warnings": list(_seen)}
    return data


@contextlib.contextmanager
def warnings_as_messages() -> Iterator[None]:
    """While a command runs, a warning is `warning: <message>` on stderr, not Python's
    `file:line: Category: message` (which names kjit's source, not the user's problem).
    The messages are kept for the --json object. Library users keep Python's warnings."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        _seen.append(text)
        with contextlib.suppress(OSError):
            click.echo(f"warning: {text}", err=True)

    _seen.clear()
    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def wants_json(args: Sequence[str]) -> bool:
    """Whether --json is on the command line (before a `--`)."""
    for a in args:
        if a == "--":
            return False
        if a == "--json":
            return True
    return False


def describe(exc: BaseException) -> tuple[str, str, int, dict[str, Any]]:
    """(type, message, exit code, extra JSON fields) for an exception leaving a command."""
    original = getattr(exc, "original", exc)
    extra: dict[str, Any] = {}
    for name in ("log", "error_log", "info_log"):
        value = getattr(original, name, None)
        if isinstance(value, str) and value.strip():
            extra[name] = value
    if isinstance(exc, click.UsageError):  # BadParameter, NoSuchOption, MissingParameter...
        return "UsageError", exc.format_message(), EXIT_USAGE, extra
    if isinstance(original, KjitError) and _bad_setting(original):  # KJIT_CACHE_SIZE=abc
        return "UsageError", str(original), EXIT_USAGE, extra
    if isinstance(exc, click.ClickException):
        return type(original).__name__, exc.format_message(), exc.exit_code, extra
    if isinstance(exc, KjitError):
        return type(exc).__name__, str(exc), EXIT_FAILED, extra
    if isinstance(original, MemoryError):   # a limit of the process's, not a fault in kjit
        return "OutOfMemory", OUT_OF_MEMORY, EXIT_FAILED, extra
    if isinstance(exc, (click.Abort, KeyboardInterrupt, EOFError)):
        ctrl_c = isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt)
        return "Interrupted", "interrupted", EXIT_INTERRUPTED if ctrl_c else EXIT_FAILED, extra
    return "InternalError", f"{type(exc).__name__}: {exc}", EXIT_INTERNAL, extra


def _bad_setting(exc: KjitError) -> bool:
    from ..settings import SettingError
    return isinstance(exc, SettingError)


def report(exc: BaseException, as_json: bool) -> int:
    """Tell the user (or the script) about `exc`; returns the exit code."""
    kind, message, code, extra = describe(exc)
    if code == EXIT_INTERNAL:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        message += " (an internal error in kjit: please report it with the traceback above)"
    if as_json:
        error = {"type": kind, "message": message, "exit_code": code, **extra}
        _echo(json.dumps(with_warnings({"error": error}), indent=2, sort_keys=True, default=str))
    elif isinstance(exc, click.ClickException) and not isinstance(exc, CommandFailed):
        exc.show()
    else:  # an interrupt too: one line, no "Aborted!", no traceback
        _echo(f"error: {message}", err=True)
    return code


def _echo(text: str, err: bool = False) -> None:
    """Print the last word of a failed command; a closed pipe cannot turn it into a traceback."""
    try:
        click.echo(text, err=err)
    except OSError:
        pass
