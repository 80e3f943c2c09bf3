"""`kjit link`: PTX, cubin, fatbin, LTO-IR, host objects and archives into one cubin."""
from __future__ import annotations

import click

from ..errors import KjitError
from .common import check_link_arch, emit, fail, json_option, sidecar_option, usage_errors

DEFAULT_OUTPUT = "linked.cubin"


@click.command("link")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--arch", help="Target architecture (sm_90); default: this GPU, $KJIT_ARCH, or the inputs' own.")
@click.option("--backend", type=click.Choice(["auto", "driver", "nvjitlink"]), default="auto",
              show_default=True, help="Which linker: auto picks nvJitLink for LTO-IR, no GPU, or PTX newer than the driver.")
@click.option("--lto", is_flag=True, help="Link-time optimisation (on by itself for LTO-IR inputs).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help=f"Output cubin; - for standard output (default {DEFAULT_OUTPUT}).")
@click.option("--max-registers", type=click.IntRange(1, 255), help="Cap registers per thread.")
@click.option("-O", "--opt-level", "optimization_level", type=click.IntRange(0, 4), help="Optimisation level 0-4.")
@click.option("--line-info", is_flag=True, help="Generate line information.")
@click.option("-G", "--debug", is_flag=True, help="Debug information.")
@click.option("-v", "--verbose", is_flag=True, help="The linker reports what it did in the info log.")
@click.option("--fast-math", is_flag=True, help="LTO: flush denormals, fast division and sqrt, FMA.")
@click.option("--device-runtime/--no-device-runtime", default=None,
              help="Link libcudadevrt.a (default: when the code launches kernels from the device).")
@click.option("-X", "--extra", multiple=True, help="A raw nvJitLink flag (repeatable; selects nvJitLink).")
@click.option("--no-cache", is_flag=True, help="Link even if the cache has the result.")
@sidecar_option(False)
@json_option
def link_cmd(inputs, arch, backend, lto, output, max_registers, optimization_level, line_info,
             debug, verbose, fast_math, device_runtime, extra, no_cache, sidecar, as_json):
    """Link INPUTS (kinds are read from the bytes; .a archives are libraries) into a cubin."""
    from ..linker import LinkOptions, link
    from . import output as output_mod
    out = output or DEFAULT_OUTPUT
    output_mod.check(out, inputs, as_json)
    with usage_errors():
        options = LinkOptions(max_registers=max_registers, optimization_level=optimization_level,
                              line_info=line_info, debug=debug, verbose=verbose,
                              fast_math=fast_math, device_runtime=device_runtime, extra=list(extra))
    check_link_arch(arch)
    try:
        from ..fileio import MAX_BINARY_BYTES, check_input
        for f in inputs:   # before any is opened: a FIFO would block, /dev/zero fill memory
            check_input(f, MAX_BINARY_BYTES, "link input")
        res = link(list(inputs), arch=arch, backend=backend, lto=lto, options=options,
                   cache=not no_cache)
        written = output_mod.write(res.object, out, sidecar=sidecar)
    except KjitError as exc:
        raise fail(exc)
    info = {"output": written, "kind": res.object.kind, "arch": res.arch, "size": len(res.code),
            "backend": res.backend, "reason": res.reason,
            "entry_points": list(res.object.entry_points), "info_log": res.info_log,
            "error_log": res.error_log, "wall_time_ms": res.wall_time_ms,
            "cache_hit": res.cache_hit, "device_runtime": res.device_runtime,
            "inputs": list(res.object.metadata.get("inputs", []))}
    emit(info, as_json, _text, err=output_mod.summary_to_stderr(out))


def _text(d: dict) -> str:
    # libcudadevrt brings its own internal kernels; they are in --json, not in the summary.
    kernels = [k for k in d["entry_points"] if not k.startswith("__nv_static_")]
    lines = [f"wrote {d['output']} (cubin, {d['arch']}, {d['size']} bytes) with {d['backend']} "
             f"({d['reason']}); kernels: {', '.join(kernels) or '(none)'}"]
    if d["device_runtime"]:
        lines.append(f"device runtime: {d['device_runtime']}")
    for name in ("info_log", "error_log"):
        if d[name].strip():
            lines.append(d[name].rstrip())
    return "\n".join(lines)
