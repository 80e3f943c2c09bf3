"""`kjit compile`: one source file to PTX, cubin or LTO-IR."""
from __future__ import annotations

import os
from pathlib import Path

import click

from ..errors import KjitError
from .common import (check_compile_request, compile_flags, compile_options_from_cli, emit, fail,
                     json_option, kernel_names, kind_text, sidecar_option, utf8_only)


# A relocatable cubin (kind "object", from --relocatable) is still a .cubin file.
_SUFFIX = {"object": ".cubin"}


@click.command("compile")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--arch", help="Target architecture (sm_90, compute_90, gfx90a); default: this GPU or $KJIT_ARCH.")
@click.option("--emit", "target", type=click.Choice(["cubin", "ptx", "ltoir", "hsaco"]),
              help="What to produce (default cubin; hsaco for --backend hip).")
@click.option("--backend", type=click.Choice(["cuda", "hip"]), default="cuda", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Output file; - for standard output (default: SOURCE with the target's suffix).")
@click.option("--name-expression", "name_expressions", multiple=True,
              help="A template instantiation to compile and name, e.g. 'axpy<float>'.")
@click.option("--no-cache", is_flag=True, help="Compile even if the cache has the result.")
@sidecar_option(False)
@compile_flags
@json_option
def compile_cmd(source, arch, target, backend, output, name_expressions, no_cache, sidecar,
                include_dirs,
                defines, std, fast_math, line_info, debug, max_registers, relocatable, extra,
                no_toolkit_headers, no_std_headers,
                no_nvcc_prelude, as_json):
    """Compile SOURCE with NVRTC (or hiprtc) and write the result."""
    from ..compiler import compile as kjit_compile, decode_source, source_name
    from ..fileio import MAX_SOURCE_BYTES, read_input
    from . import output as output_mod
    src_path = Path(source)
    output_mod.check(output, [source], as_json)
    opts = compile_options_from_cli(std, defines, include_dirs, fast_math, line_info, debug,
                                    max_registers, relocatable, extra, no_toolkit_headers, no_std_headers,
                                    no_nvcc_prelude)
    check_compile_request(arch, target, backend, opts, name_expressions)
    try:
        utf8_only("source", [os.path.abspath(source)], "rename it (or its directory)")
        text = decode_source(read_input(src_path, MAX_SOURCE_BYTES, "source"), source)
        obj = kjit_compile(text, arch=arch, target=target, options=opts,
                           name_expressions=name_expressions, backend=backend,
                           name=source_name(source), cache=not no_cache)
        out = output or str(src_path.with_suffix(_SUFFIX.get(obj.kind, "." + obj.kind)))
        output_mod.check(out, [source], as_json)
        written = output_mod.write(obj, out, sidecar=sidecar)
    except KjitError as exc:
        raise fail(exc)
    info = {"output": written, "kind": obj.kind, "arch": obj.arch, "size": len(obj.code),
            "entry_points": list(obj.entry_points), "symbols": dict(obj.symbols),
            "log": obj.log, "cache_hit": obj.cache_hit}
    emit(info, as_json, lambda d: (
        f"wrote {d['output']} ({kind_text(d['kind'])}, {d['arch']}, {d['size']} bytes); "
        f"kernels: {', '.join(kernel_names({'kernels': d['entry_points'], 'symbols': d['symbols']})) or '(none)'}"
        + (f"\n{d['log'].strip()}" if d["log"].strip() else "")),
        err=output_mod.summary_to_stderr(output))
