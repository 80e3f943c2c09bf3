"""`kjit inspect`: what a fatbin, cubin, PTX, LTO-IR or HIP bundle holds, without a GPU.

For each entry: kind, arch, size (and compression); for cubins the per-kernel resource
usage from the ELF sections (kjit.nvinfo); for PTX its ISA version and entry points.
"""
from __future__ import annotations

import os
from typing import Any

import click

from ..errors import KjitError
from .common import emit, fail, human_size, json_option, kind_text


def inspect_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON-able description of one file; KjitError if it is none of the kinds kjit reads."""
    from ..formats import fatbin_entries
    from ..objectcode import ObjectCode
    obj = ObjectCode.from_file(path)
    entries = []
    names: list[str] = []
    for entry in fatbin_entries(obj.code, obj.kind):
        if entry.kind == "host" and not entry.code:
            continue  # the empty host entry every HIP bundle carries holds no code
        arch = entry.arch or (obj.arch if obj.kind == entry.kind else "") or ""
        d = entry.describe()
        d["arch"] = arch
        d["kernels"], problem = _kernels(entry)
        if problem:
            d["note"] = "; ".join(filter(None, [d.get("note"), problem]))
        if entry.kind == "ptx" and entry.decoded:
            from ..formats import PTX_TARGET_RE, ptx_version
            v = ptx_version(entry.code)
            d["ptx_version"] = ".".join(map(str, v)) if v else d["ptx_version"]
            m = PTX_TARGET_RE.search(entry.code)
            d["ptx_target"] = m.group(1).decode() if m else None
        for k in d["kernels"]:
            if k["name"] not in names:
                names.append(k["name"])
        entries.append(d)
    return {"file": str(path), "kind": obj.kind, "size": len(obj.code), "arch": obj.arch,
            "symbols": dict(obj.symbols), "kernels": names, "entries": entries}


def _kernels(entry: Any) -> tuple[list[dict[str, Any]], str]:
    """Per-kernel facts for one entry (resources for cubins, names for PTX and AMD code),
    and what could not be read: a malformed .nv.info leaves the kernels' names, and says so."""
    if not entry.decoded:
        return [], ""
    from ..objectcode import ObjectCode
    try:
        if entry.kind in ("cubin", "object"):
            from ..formats import kernel_resources
            return [k.as_dict() for k in kernel_resources(entry.code)], ""
        if entry.kind in ("ptx", "hsaco"):
            return [{"name": n} for n in ObjectCode(entry.code, kind=entry.kind).entry_points], ""
    except KjitError as exc:
        try:
            names = [{"name": n} for n in ObjectCode(entry.code, kind=entry.kind).entry_points]
        except KjitError:
            names = []
        return names, f"kernel resources unreadable: {exc}"
    return [], ""  # LTO-IR is NVVM bitcode: its kernels are known only after linking


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


def _text(d: dict[str, Any]) -> str:
    width = max([6] + [len(kind_text(e["kind"])) for e in d["entries"]])
    lines = [f"{d['file']}: {kind_text(d['kind'])}, {human_size(d['size'])}"
             + (f", {len(d['entries'])} entries" if d["kind"] in ("fatbin", "hipfb") else "")]
    for e in d["entries"]:
        extra = []
        if e["compression"]:
            extra.append(f"{e['compression']}, {human_size(e['stored_size'])} stored"
                         if e["decoded"] else f"{e['compression']}-compressed")
        if e.get("ptx_version"):
            extra.append(f"PTX ISA {e['ptx_version']}")
        if e.get("note"):
            extra.append(e["note"])
        lines.append(f"  {kind_text(e['kind']):<{width}} {e['arch'] or '?':<12} {human_size(e['size']):>10}"
                     + (f"  ({'; '.join(extra)})" if extra else ""))
        ks = e["kernels"]
        if ks and "registers" in ks[0]:
            lines.append(f"      {'kernel':<28} {'regs':>5} {'shared':>7} {'local':>6} "
                         f"{'stack':>6} {'maxthr':>6} {'params':>6}")
            for k in ks:
                lines.append(f"      {k['name']:<28} {_dash(k['registers']):>5} "
                             f"{k['shared_bytes']:>7} {k['local_bytes']:>6} {k['stack_bytes']:>6} "
                             f"{_dash(k['max_threads']):>6} {_dash(k['param_bytes']):>6}")
        elif ks:
            lines.append("      kernels: " + ", ".join(k["name"] for k in ks))
    if d["symbols"]:
        lines.append("names: " + ", ".join(f"{k} -> {v}" for k, v in sorted(d["symbols"].items())))
    return "\n".join(lines)


@click.command("inspect")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@json_option
def inspect_cmd(files: tuple[str, ...], as_json: bool) -> None:
    """Show the entries, kernels and per-kernel resources of FILES (fatbin, cubin, PTX,
    LTO-IR, HIP bundle). Shared, local and stack sizes are bytes; local is per thread and
    includes register spills. --json prints one object per file (a list for several)."""
    data = []
    for f in files:
        try:
            data.append(inspect_file(f))
        except KjitError as exc:
            raise fail(type(exc)(f"{f}: {exc}") if str(f) not in str(exc) else exc)
    if as_json:
        emit(data[0] if len(data) == 1 else data, True, str)
    else:
        click.echo("\n\n".join(_text(d) for d in data))
