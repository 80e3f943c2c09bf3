"""`kjit cache ... --remote` and `kjit cache push`: the shared tier (docs/cluster.md)."""
from __future__ import annotations

import click

from .common import confirm_removal, emit, fail, json_option, kernel_names, kind_text
from .common import human_size as _size, timestamp as _when
from ..errors import KjitError


def _ops():
    from .. import cache
    return cache


_UNSIGNED = ("NO: set KJIT_REMOTE_CACHE_KEY_FILE to sign (trusted unsigned: "
             "KJIT_REMOTE_CACHE_UNSIGNED=1)")


def _ttl(t) -> str:
    if t is None:
        return "never"
    return f"{t / 86400:.1f}d" if t >= 86400 else f"{t / 3600:.1f}h" if t >= 3600 else f"{t:.0f}s"


def ls(limit, as_json: bool) -> None:
    try:
        rows = _ops().ls_remote(limit=limit)
    except KjitError as exc:
        raise fail(exc)
    for r in rows:
        if "kernels" in r:
            r["names"] = kernel_names(r)

    def text(rows):
        if not rows:
            return "(no entries in the remote cache)"
        width = max([6] + [len(kind_text(r.get("kind"))) for r in rows])
        lines = [f"{'KEY':16}  {'KIND':{width}} {'ARCH':11} {'SIZE':>10} {'SIGNED':6} {'EXPIRES':>8}  "
                 f"{'CREATED':19}  KERNELS"]
        for r in rows:
            if r.get("error") or r.get("note"):
                lines.append(f"{r['key'][:16]}  ({r.get('error') or r['note']})")
                continue
            kernels = ", ".join(r["names"]) or "-"
            lines.append(f"{r['key'][:16]}  {kind_text(r.get('kind')):{width}} {str(r.get('arch') or '-'):11} "
                         f"{_size(r.get('size')):>10} {'yes' if r['signed'] else 'no':6} "
                         f"{_ttl(r.get('ttl_s')):>8}  {_when(r.get('created')):19}  {kernels}")
        return "\n".join(lines)
    emit(rows, as_json, text)


def stats(as_json: bool) -> None:
    try:
        s = _ops().stats_remote()
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        srv = d["server"]
        limit = _size(srv["maxmemory"]) if srv.get("maxmemory") else "no limit"
        lines = [f"remote     {d['url']} (prefix {d['prefix']})",
                 f"signed     {'yes (HMAC-SHA256)' if d['signed'] else _UNSIGNED}",
                 f"entries    {d['entries']}",
                 f"bytes      {d['bytes']} ({_size(d['bytes'])}); values over {_size(d['max_value'])} "
                 f"stay local",
                 f"ttl        {_ttl(d['ttl_s'] or None)} after last use"]
        if "redis_version" in srv:
            lines.append(f"server     Redis {srv.get('redis_version')}, {_size(srv.get('used_memory'))} "
                         f"used of {limit} ({srv.get('maxmemory_policy')}), {srv.get('evicted_keys')} "
                         f"evicted, {srv.get('expired_keys')} expired")
        else:  # another backend: what it says about itself
            rest = ", ".join(f"{k} {v}" for k, v in srv.items() if k != "server")
            lines.append(f"server     {srv.get('server') or '(not described)'}" + (f" ({rest})" if rest else ""))
        return "\n".join(lines)
    emit(s, as_json, text)


def clear(yes: bool, as_json: bool) -> None:
    from ..cache import RemoteConfig
    try:
        config = RemoteConfig.from_env()
    except KjitError as exc:
        raise fail(exc)
    if config is not None:
        confirm_removal(f"every entry under {config.prefix} in the shared tier at "
                        f"{config.display_url}, for every node that uses it", yes, as_json)
    try:
        report = _ops().clear_remote_report()
    except KjitError as exc:
        raise fail(exc)
    emit(report, as_json, lambda d: f"removed {d['removed']} entries from the remote cache"
         + (f" (and {d['other']} other values: the cluster's records of what compiles read)"
            if d["other"] else ""))


def local_lines(d: dict) -> str:
    """`kjit cache stats` lines for the shared tier's counts as this directory saw them."""
    r = d.get("remote") or {}
    if not r.get("url") and not any(v for k, v in r.items() if k != "url"):
        return ""
    return (f"\nremote     {r.get('url') or '(not configured now)'}\n"
            f"  hits {r['hits']}, misses {r['misses']}, errors {r['errors']}, refused {r['refused']} "
            f"(bad or no signature), corrupt {r['corrupt']}, too large {r['too_large']}, "
            f"skipped while down {r['skipped']}, published {r['puts']}, "
            f"leases without a sane expiry {r.get('bad_leases', 0)}")


@click.command("push")
@click.option("--key", "keys", multiple=True, help="Push only this entry (repeatable; prefixes ok).")
@click.option("--overwrite", is_flag=True, help="Replace values already in the remote cache.")
@json_option
def push_cmd(keys, overwrite: bool, as_json: bool) -> None:
    """Upload local entries to the remote cache (e.g. after `kjit build` in CI, to warm a cluster)."""
    try:
        r = _ops().push(keys=list(keys) or None, overwrite=overwrite)
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        lines = [f"pushed {d['pushed']} entries ({_size(d['bytes'])}) to {d['url']}"
                 f"{'' if d['signed'] else ' UNSIGNED'}; {d['already_present']} already there, "
                 f"{d['too_large']} too large, {len(d['skipped'])} corrupt (skipped)"]
        lines += [f"  skipped {c['key'][:16]}: {c['error']}" for c in d["skipped"]]
        return "\n".join(lines)
    emit(r, as_json, text)
