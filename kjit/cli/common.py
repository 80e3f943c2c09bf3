"""Options and helpers shared by the subcommands."""
from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any, Callable, Iterator

import click

from ..errors import InvalidOptionError, KjitError
from ..settings import SettingError
from .failures import CommandFailed, with_warnings

json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")

@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """An InvalidOptionError raised while checking the command line's values (before any
    input is read) is a usage error: exit 2, "UsageError" in --json, said in the command
    line's terms. A KJIT_* setting read meanwhile is no part of the command line: its
    SettingError goes on, to be reported as every bad setting is (one `error:` line, no
    usage block; exit 2)."""
    try:
        yield
    except SettingError:
        raise
    except InvalidOptionError as exc:
        raise click.UsageError(shell_terms(str(exc)),
                               click.get_current_context(silent=True)) from None


# kjit.compile's words for its arguments -> the command line's options
_SHELL_TERMS = [
    (re.compile(r"^arch '"), "--arch '"),
    (re.compile(r"backend='(\w+)'"), r"--backend \1"),
    (re.compile(r"^target[= ]'(\w+)'"), r"--emit \1"),
    (re.compile(r"^max_registers must be an int in"), "--max-registers must be a whole number in"),
    (re.compile(r"^name expression (.*) must be a non-empty string"), r"--name-expression \1 must not be empty"),
    (re.compile(r"^define name "), "-D "),
    (re.compile(r"^include directory "), "-I "),
]


def shell_terms(message: str) -> str:
    """An argument error of kjit's functions said with the options of the command line:
    `--arch 'sm_xx'` and `--emit ltoir`, not arch='sm_xx' and target='ltoir'."""
    for pattern, words in _SHELL_TERMS:
        message = pattern.sub(words, message)
    return message


def sidecar_option(default: bool) -> Callable:
    """--sidecar/--no-sidecar: whether `<output>.kjit.json` is written beside the output."""
    return click.option(
        "--sidecar/--no-sidecar", default=default, show_default=True,
        help="Also write OUTPUT.kjit.json: the name expressions, the kernels' parameter types "
             "and an arch the bytes cannot hold, which kjit.load and kjit inspect read back.")


yes_option = click.option("--yes", "-y", is_flag=True,
                          help="Do not ask; needed where there is no terminal to ask on, and with --json.")


def on_terminal() -> bool:
    """Whether a person can be asked: stdin and stderr are terminals."""
    import sys
    return sys.stdin.isatty() and sys.stderr.isatty()


def confirm_removal(what: str, yes: bool, as_json: bool) -> None:
    """Before a command removes `what` (saying what and where): ask on a terminal; with no
    terminal, or with --json (whose output must stay JSON), refuse without --yes (exit 2).
    Declining removes nothing, says so and exits 1."""
    if yes:
        return
    if as_json or not on_terminal():
        raise click.UsageError(f"this removes {what}; pass --yes to do it"
                               + ("" if as_json else " (there is no terminal to ask on)"))
    if not click.confirm(f"Remove {what}?", default=False, err=True):
        click.echo("nothing removed", err=True)
        raise SystemExit(1)


def emit(data: Any, as_json: bool, text: Callable[[Any], str], *, err: bool = False) -> None:
    """Print `data` as JSON or as the text `text(data)` renders (on stderr with err=True,
    when the command's output bytes go to stdout). With --json, an object gains the
    command's warnings as "warnings" (a list; also on stderr)."""
    if as_json:
        click.echo(json.dumps(with_warnings(data), indent=2, sort_keys=True, default=str))
    else:
        click.echo(text(data), err=err)


def timestamp(ts) -> str:
    """A time as `kjit cache` prints it; "-" for none."""
    if not ts:
        return "-"
    import datetime
    return datetime.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")


def human_size(n) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


_KIND_WORDS = {"object": "relocatable cubin"}   # kjit's kind for an ELF of e_type ET_REL


def kind_text(kind: Any) -> str:
    """A kind as the text output says it: `object` (the kind's name in --json and the API)
    is a relocatable cubin (-rdc), the others as they are."""
    return _KIND_WORDS.get(kind, str(kind or ""))


def kernel_names(row: dict[str, Any]) -> list[str]:
    """A cache entry's kernels as C++ calls them, for `kjit cache ls` and `show`: a lowered
    name a name expression gave as that expression (`scale<float>`), another mangled name
    demangled (`ns::fill`, with its parameters where two kernels share the name), an
    `extern "C"` name as it is. An entry whose kernels are known only after linking (LTO-IR)
    gives its name expressions, if any."""
    from ..runtime import demangle, function_name
    symbols = row.get("symbols") if isinstance(row.get("symbols"), dict) else {}
    by_lowered = {v: k for k, v in symbols.items() if isinstance(k, str) and isinstance(v, str)}
    kernels = [k for k in row.get("kernels") or [] if isinstance(k, str)]
    if not kernels:
        return list(by_lowered.values())
    named = [by_lowered.get(k) or (function_name(k) or (k,))[0] for k in kernels]
    return [n if named.count(n) == 1 or k in by_lowered else demangle(k) or n
            for k, n in zip(kernels, named)]


def fail(exc: KjitError) -> "click.ClickException":
    """A KjitError as a click error: a message (or --json error object) and exit code 1,
    no traceback; the error's type is kept for --json."""
    return CommandFailed(exc)


def utf8_only(option: str, values, fix: str) -> None:
    """InvalidOptionError for a command-line value that is not UTF-8 (Python holds its bad
    bytes as surrogates): the compiler takes its options, and the cache key holds them, as
    UTF-8 text."""
    for v in values:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = os.fsencode(v[exc.start:exc.end])
            raise InvalidOptionError(
                f"{option} {os.fsencode(v)!r} is not UTF-8 (byte 0x{bad[0]:02x} at character "
                f"{exc.start}): kjit hands it to the compiler, and keys the cache by it, as UTF-8 "
                f"text; {fix}") from None


def compile_options_from_cli(std, defines, include_dirs, fast_math, line_info, debug,
                             max_registers, relocatable, extra, no_toolkit_headers=False,
                             no_std_headers=False, no_nvcc_prelude=False):
    """CompileOptions from the command line; a bad value (-D, --max-registers, -X) is a
    usage error."""
    from ..compiler import CompileOptions
    with usage_errors():
        utf8_only("-I", include_dirs, "rename the directory, or link to it under a UTF-8 name")
        utf8_only("-D", defines, "write the macro in UTF-8")
        utf8_only("-X", extra, "write the flag in UTF-8")
        return CompileOptions(std=std, defines=list(defines), include_dirs=list(include_dirs),
                              fast_math=fast_math, line_info=line_info, debug=debug,
                              max_registers=max_registers, relocatable=relocatable,
                              extra=list(extra), toolkit_headers=not no_toolkit_headers,
                              std_headers=not no_std_headers,
                              nvcc_prelude=not no_nvcc_prelude)


def check_build_archs(archs, ptx_archs, no_ptx, backend) -> None:
    """`kjit build`'s --arch / --ptx / --no-ptx as kjit.build reads them, as usage errors."""
    from ..build import resolve_archs, resolve_ptx
    with usage_errors():
        arch_list = resolve_archs(archs, backend)
        if backend != "hip":
            resolve_ptx(arch_list, list(ptx_archs) + [a for a in arch_list if a.startswith("compute_")],
                        no_ptx)


def check_link_arch(arch) -> None:
    """`kjit link --arch`: a CUDA architecture, as a usage error."""
    if arch is None:
        return
    from .. import arch as arch_mod
    with usage_errors():
        if arch_mod.parse(arch).backend != "cuda":
            raise InvalidOptionError(f"--arch {arch!r} is not a CUDA architecture: kjit link makes cubins")


def check_compile_request(arch, target, backend, options, name_expressions=()) -> None:
    """Everything kjit.compile checks of its arguments but the source (--arch, --emit,
    --backend, the options, name expressions; no --arch and no GPU), as usage errors,
    before any input is read."""
    from ..compiler import make_request
    with usage_errors():
        utf8_only("--name-expression", name_expressions, "write it in UTF-8")
        try:
            make_request("", arch=arch, target=target, options=options, backend=backend,
                         name_expressions=name_expressions)
        except SettingError:
            raise
        except InvalidOptionError as exc:
            raise InvalidOptionError(_in_shell_terms(str(exc), arch, target)) from None


def _in_shell_terms(message: str, arch: Any, target: Any) -> str:
    """An argument error of kjit.compile said as the command line's options: `--arch`, not
    arch='sm_90', and the command that does what was likely meant."""
    message = message.replace("pass arch='sm_90' (or --arch sm_90)", "pass --arch sm_90")
    if target is None:
        message = message.replace("target 'cubin' needs", "--emit cubin (the default) needs", 1)
    text = str(arch or "")
    if target == "hsaco" and "backend='hip'" not in message and "--backend hip" not in message:
        message += "\nhsaco is the HIP backend's code object: add --backend hip (and a gfx --arch)"
    if "," in text:
        message += (f"\n`kjit compile` makes one binary for one --arch; for several in one fatbin: "
                    f"kjit build SOURCE --arch {text} -o out.fatbin")
    elif text.startswith("compute_") and target in (None, "cubin"):
        message += f"\n{text} is a virtual architecture, compiled to PTX: add --emit ptx"
    return message


def compile_flags(fn: Callable) -> Callable:
    """The compile options every compiling command takes."""
    for opt in reversed([
        click.option("-I", "--include", "include_dirs", multiple=True, type=click.Path(file_okay=False),
                     help="Add an include directory."),
        click.option("-D", "--define", "defines", multiple=True, help="Define a macro: NAME or NAME=VALUE."),
        click.option("--std", type=click.Choice(["c++03", "c++11", "c++14", "c++17", "c++20"]),
                     help="C++ dialect."),
        click.option("--fast-math", is_flag=True, help="--use_fast_math."),
        click.option("--line-info", is_flag=True, help="Generate line information."),
        click.option("-G", "--debug", is_flag=True, help="Device debug information."),
        click.option("--max-registers", type=int, help="Cap registers per thread."),
        click.option("--relocatable", "-rdc", is_flag=True, help="Relocatable device code (for linking)."),
        click.option("-X", "--extra", multiple=True, help="A raw compiler flag (repeatable)."),
        click.option("--no-toolkit-headers", is_flag=True,
                     help="Do not search the CUDA toolkit and CCCL headers from NVIDIA's wheels "
                          "(HIP: hiprtc's built-in header names); see docs/headers.md."),
        click.option("--no-std-headers", is_flag=True,
                     help="Leave out kjit's device-side <cstdint>, <cmath>, <cstdio>... (NVRTC)."),
        click.option("--no-nvcc-prelude", is_flag=True,
                     help="Do not pre-include what nvcc's implicit cuda_runtime.h gives device "
                          "code (INFINITY, M_PI, FLT_MAX, uint...; NVRTC)."),
    ]):
        fn = opt(fn)
    return fn
