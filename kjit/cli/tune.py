"""`kjit tune`: the autotuning results kept in the cache (ls, show, clear)."""
from __future__ import annotations

import click

from .common import confirm_removal, emit, fail, json_option, yes_option
from ..errors import InvalidOptionError, KjitError


def _store():
    from .. import tune
    return tune


# The records' fields are checked for their kind (tune/store.py); what is inside a key
# value or a configuration is shown as it is, whatever it holds.
def _key_text(key: dict) -> str:
    parts = []
    for k, v in key.items():
        if isinstance(v, dict) and isinstance(v.get("shape"), list):
            v = f"{v.get('dtype')}[{'x'.join(map(str, v['shape']))}]"
        parts.append(f"{k}={v}")
    return ", ".join(parts) or "-"


def _items(value) -> list:
    return list(value.items()) if isinstance(value, dict) else []


def _config_text(cfg: dict) -> str:
    parts = [f"{k}={v}" for k, v in _items(cfg.get("params"))]
    parts += [f"-D{k}" + ("" if v is None else f"={v}") for k, v in _items(cfg.get("defines"))]
    for name in ("block", "shared_mem"):
        if name in cfg and not str(cfg[name]).startswith("<function"):
            parts.append(f"{name}={cfg[name]}")
    return ", ".join(parts) or "(defaults)"


def _result_text(r: dict | None) -> str:
    if not r:
        return "(unreadable)"
    if r.get("status") == "ok":
        reps = f" ({r['reps']} reps)" if "reps" in r else ""
        return f"{r['ms']:.4f} ms{reps}"
    return f"{r.get('status')}: {str(r.get('reason', '')).splitlines()[0] if r.get('reason') else ''}"


@click.group("tune")
def tune_group() -> None:
    """Autotuning results: each configuration's timing per kernel, device and key values."""


@tune_group.command("ls")
@click.option("--kernel", "-k", help="Only kernels whose name contains this.")
@json_option
def ls_cmd(kernel: str | None, as_json: bool) -> None:
    """List tuned (kernel, device, key values) with the best configuration found."""
    try:
        groups = _store().record_groups(kernel)
    except KjitError as exc:
        raise fail(exc)

    def text(groups):
        if not groups:
            return "(no tuning results)"
        lines = [f"{'ID':12}  {'KERNEL':20} {'DEVICE':28} {'CONFIGS':>7}  {'BEST':>12}  KEY"]
        for g in groups:
            best = f"{g['best']['ms']:.4f} ms" if g["best"] else "-"
            lines.append(f"{g['id']:12}  {g['kernel'][:20]:20} {str(g['device'].get('name'))[:28]:28} "
                         f"{len(g['configs']):>7}  {best:>12}  {_key_text(g['key'])}")
        return "\n".join(lines)
    emit(groups, as_json, text)


def _find(ident: str) -> dict:
    ident = ident.strip().lower()
    found = [g for g in _store().record_groups() if g["id"].startswith(ident)]
    if not ident or not found:
        raise fail(InvalidOptionError(f"no tuning result has an ID starting with {ident!r} "
                                      "(see `kjit tune ls`)"))
    if len(found) > 1:
        raise fail(InvalidOptionError(f"{ident!r} matches {len(found)} tuning results; give more characters"))
    return found[0]


@tune_group.command("show")
@click.argument("ident")
@json_option
def show_cmd(ident: str, as_json: bool) -> None:
    """Show every configuration's result for one tuning (IDENT from `kjit tune ls`)."""
    g = _find(ident)

    def text(g):
        d = g["device"]
        lines = [f"kernel:  {g['kernel']}",
                 f"device:  {d.get('name')} ({d.get('sms')} SMs, cc {d.get('cc')}, driver {d.get('driver')})",
                 f"key:     {_key_text(g['key'])}",
                 f"best:    {_config_text(g['best']['config']) + ' ' + format(g['best']['ms'], '.4f') + ' ms' if g['best'] else '-'}",
                 ""]
        for c in g["configs"]:
            lines.append(f"  {_result_text(c['result']):32}  {_config_text(c['config'])}")
        return "\n".join(lines)
    emit(g, as_json, text)


@tune_group.command("clear")
@click.option("--kernel", "-k", help="Only the results of kernels whose name contains this.")
@yes_option
@json_option
def clear_cmd(kernel: str | None, yes: bool, as_json: bool) -> None:
    """Delete tuning results (also from the shared tier when one is configured): the next
    launch times its configurations again. Asks first on a terminal; --yes elsewhere."""
    from ..cache import RemoteConfig
    try:
        shared = RemoteConfig.from_env()
    except KjitError:
        shared = None
    which = f"of kernels whose name contains {kernel!r}" if kernel else "of every kernel"
    where = "the local cache" + (f" and the shared tier at {shared.display_url} (every node's)"
                                 if shared is not None else "")
    confirm_removal(f"the tuning results {which} from {where}", yes, as_json)
    try:
        n = _store().clear_records(kernel)
    except KjitError as exc:
        raise fail(exc)
    emit({"removed": n}, as_json, lambda d: f"removed {d['removed']} tuning record(s)")
