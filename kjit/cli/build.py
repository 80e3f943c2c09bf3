"""`kjit build`: parse the arguments, run kjit.build.run_build, print what it did."""
from __future__ import annotations

import os
from typing import Any

import click

from ..build import COMPRESS_CHOICES, run_build
from ..errors import KjitError
from ..progress import Bar
from .common import (check_build_archs, compile_flags, compile_options_from_cli, emit, fail,
                     human_size, json_option, kind_text, sidecar_option, utf8_only)


def _text(d: dict[str, Any]) -> str:
    width = max([6] + [len(kind_text(e["kind"])) for e in d["entries"]])
    lines = [f"wrote {d['output']} ({kind_text(d['kind'])}, {human_size(d['size'])}, {len(d['entries'])} "
             f"entries) in {d['seconds']:.2f} s"]
    for e in d["entries"]:
        verb = "linked" if e.get("linked") else "compiled"
        how = "reused from cache" if e["cache_hit"] else (
            f"{verb} ({e['ms']:.0f} ms)" if e.get("ms") is not None else verb)
        lines.append(f"  {kind_text(e['kind']):<{width}} {e['arch']:<12} {human_size(e['size']):>10}  {how}")
    if d["symbols"]:
        lines.append("  names: " + ", ".join(f"{k} -> {v}" for k, v in sorted(d["symbols"].items())))
    cache = f"cache: {d['reused']} of {d['compiles']} compiles reused"
    if d["links"]:
        cache += f", {d['links_reused']} of {d['links']} links reused"
    lines.append(cache)
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines)


def _check_inputs(sources, link_files) -> None:
    """Every source and link input is a regular file of a size kjit reads, before any is
    opened (a FIFO would block the open, /dev/zero fill memory)."""
    from ..fileio import MAX_BINARY_BYTES, MAX_SOURCE_BYTES, check_input
    for s in sources:
        utf8_only("source", [os.path.abspath(s)], "rename it (or its directory)")
        check_input(s, MAX_SOURCE_BYTES, "source")
    for f in link_files:
        check_input(f, MAX_BINARY_BYTES, "link input")


@click.command("build")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Output file; - for standard output (default: the first source with .fatbin, "
                   "or .hipfb for HIP).")
@click.option("--arch", "archs", multiple=True,
              help="Architectures, repeatable or comma-separated: sm_80,sm_90a,sm_100f, "
                   "`all` (every arch NVRTC supports), `native` (this machine's GPUs); gfx90a... "
                   "for HIP. Default: this GPU or $KJIT_ARCH.")
@click.option("--ptx", "ptx_archs", multiple=True,
              help="Embed PTX for these virtual archs (compute_90); default: compute_<newest --arch>.")
@click.option("--no-ptx", is_flag=True, help="Embed no PTX (no forward compatibility).")
@click.option("--link", "link_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Link with this file (LTO-IR, cubin, PTX, fatbin, .a), repeatable.")
@click.option("--lto", is_flag=True, help="Compile to LTO-IR and link with nvJitLink per arch.")
@click.option("--name-expression", "name_expressions", multiple=True,
              help="A template instantiation to compile and name, e.g. 'axpy<float>' (repeatable).")
@click.option("--backend", type=click.Choice(["cuda", "hip"]), default="cuda", show_default=True)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compiles (default: $KJIT_COMPILE_JOBS, else the cores this process may use).")
@click.option("--compress", type=click.Choice(COMPRESS_CHOICES), default="none", show_default=True,
              help="nvFatbin compression of the entries.")
@click.option("--no-cache", is_flag=True, help="Compile even if the cache has the result.")
@sidecar_option(True)
@compile_flags
@json_option
def build_cmd(sources, output, archs, ptx_archs, no_ptx, link_files, lto, name_expressions,
              backend, jobs, compress, no_cache, sidecar, include_dirs, defines, std, fast_math, line_info,
              debug, max_registers, relocatable, extra, no_toolkit_headers, no_std_headers,
              no_nvcc_prelude, as_json):
    """Build SOURCES into one fatbin for many GPU architectures (no GPU needed)."""
    bar_box: list = []

    def progress(total: int):
        bar = Bar(total, "compiling", show=False if as_json else None)
        bar.start()
        bar_box.append(bar)
        return bar.update

    from . import output as output_mod
    output_mod.check(output, [*sources, *link_files], as_json)
    opts = compile_options_from_cli(std, defines, include_dirs, fast_math, line_info, debug,
                                    max_registers, relocatable, extra, no_toolkit_headers, no_std_headers,
                                    no_nvcc_prelude)
    check_build_archs(archs, ptx_archs, no_ptx, backend)
    try:
        _check_inputs(sources, link_files)
        result = run_build(sources, output=output, archs=archs, ptx=ptx_archs, no_ptx=no_ptx,
                           options=opts, link=link_files, lto=lto,
                           name_expressions=name_expressions, backend=backend, jobs=jobs,
                           compress=compress, cache=not no_cache, progress=progress,
                           save=lambda obj, path: output_mod.write(obj, path, make_dirs=True,
                                                                   sidecar=sidecar))
    except KjitError as exc:
        raise fail(exc)
    finally:
        for bar in bar_box:
            bar.close()
    for log in result.logs:
        click.echo(log, err=True)
    emit(result.summary(), as_json, _text, err=output_mod.summary_to_stderr(output))
