"""`kjit cache`: see into and manage the compile/link cache."""
from __future__ import annotations

import click

from . import cache_remote
from .common import (confirm_removal, emit, fail, json_option, kernel_names, kind_text,
                     usage_errors, yes_option)
from .common import human_size as _size, timestamp as _when
from ..errors import KjitError


PAGE = 50  # what `kjit cache ls` shows without --limit


def _api():
    from .. import cache
    return cache


@click.group("cache")
def cache_group() -> None:
    """Inspect and manage the kjit cache (compiled and linked code by content hash)."""


@cache_group.command("path")
@json_option
def path_cmd(as_json: bool) -> None:
    """Print the cache directory."""
    emit({"path": str(_api().path())}, as_json, lambda d: d["path"])


@cache_group.command("ls")
@click.option("--kernel", "-k", help="Only entries with a kernel or name expression containing this.")
@click.option("--arch", "-a", help="Only entries for this architecture (e.g. sm_90).")
@click.option("--sort", "-s", default="last_used", show_default=True,
              type=click.Choice(["created", "last_used", "size", "hits", "name", "arch", "kind"]))
@click.option("--reverse", "-r", is_flag=True, help="Reverse the order.")
@click.option("--limit", "-n", type=click.IntRange(min=0),
              help=f"Show at most this many; 0 for all (default: all with --json, else {PAGE}).")
@click.option("--remote", is_flag=True, help="List the remote (shared) cache instead.")
@json_option
def ls_cmd(kernel, arch, sort, reverse, limit, remote: bool, as_json: bool) -> None:
    """List entries: key, kind, arch, size, hits, last use, kernels."""
    if remote:
        return cache_remote.ls(limit, as_json)
    page = limit if limit is not None else (0 if as_json else PAGE)
    # a name as C++ writes it (ns::fill, scale<float>) is in no entry's stored names, which are
    # the lowered ones: such a filter is applied here, to the names as `ls` shows them
    cxx = kernel is not None and any(ch in kernel for ch in ":<>(),* ")
    try:  # one more than the page tells whether there are more
        rows = _api().ls(kernel=None if cxx else kernel, arch=arch, sort=sort, reverse=reverse,
                         limit=page + 1 if page and not cxx else None)
    except KjitError as exc:
        raise fail(exc)
    for r in rows:
        r["names"] = kernel_names(r)
    if cxx:
        rows = [r for r in rows if any(kernel in n for n in r["names"])]
    more = bool(page) and len(rows) > page
    rows = rows[:page] if page else rows

    def text(rows):
        if not rows:
            return "(no entries)"
        width = max([6] + [len(kind_text(r.get("kind"))) for r in rows])
        lines = [f"{'KEY':16}  {'KIND':{width}} {'ARCH':11} {'SIZE':>10} {'HITS':>5}  {'LAST USED':19}  KERNELS"]
        for r in rows:
            kernels = ", ".join(r["names"]) or "-"
            lines.append(f"{r['key'][:16]}  {kind_text(r.get('kind')):{width}} {str(r.get('arch') or '-'):11} "
                         f"{_size(r.get('size')):>10} {r.get('hits', 0):>5}  "
                         f"{_when(r.get('last_used')):19}  {kernels}")
        if more:
            lines.append(f"(the first {page}; --limit 0 lists every entry)")
        return "\n".join(lines)
    emit(rows, as_json, text)


@cache_group.command("show")
@click.argument("key")
@click.option("--source", "with_source", is_flag=True,
              help="Print the source too (stored only with KJIT_CACHE_SAVE_SOURCE=1).")
@json_option
def show_cmd(key: str, with_source: bool, as_json: bool) -> None:
    """Show one entry (KEY or a unique prefix): options, compiler, log, symbols."""
    import re
    if not re.fullmatch(r"\s*[0-9a-fA-F]{4,64}\s*", key):   # the command line is wrong: exit 2
        raise click.UsageError(f"{key!r} is not a cache key: give at least 4 hex digits of one "
                               "(see `kjit cache ls`)")
    try:
        info = _api().show(key)
    except KjitError as exc:
        raise fail(exc)
    if not with_source:
        info.pop("source", None)
    info["names"] = kernel_names(info)

    def text(d):
        lines = [f"key        {d['key']}",
                 f"kind       {kind_text(d.get('kind'))}   arch {d.get('arch')}   size {_size(d.get('size'))}",
                 f"name       {d.get('name')}   ({d.get('namespace')})",
                 f"kernels    {', '.join(d['names']) or '-'}",
                 f"compiler   {d.get('compiler') or '-'}",
                 f"created    {_when(d.get('created'))}   last used {_when(d.get('last_used'))}   "
                 f"hits {d.get('hits', 0)}   build {d.get('create_ms')} ms"]
        if d.get("source_sha256"):
            lines.append(f"source     sha256 {d['source_sha256']}")
        if d.get("options") is not None:
            lines.append("options")
            lines += [f"  {k}: {v}" for k, v in sorted(d["options"].items())]
        if d.get("symbols"):
            lines.append("symbols")
            lines += [f"  {k} -> {v}" for k, v in d["symbols"].items()]
        lines.append("log" + (":\n" + d["log"].rstrip() if d.get("log", "").strip() else "        (empty)"))
        if with_source:
            lines.append("source:\n" + (d.get("source") or
                                        "(not saved: set KJIT_CACHE_SAVE_SOURCE=1 when compiling)"))
        return "\n".join(lines)
    emit(info, as_json, text)


@cache_group.command("stats")
@click.option("--remote", is_flag=True, help="The remote (shared) cache's entries and server instead.")
@json_option
def stats_cmd(remote: bool, as_json: bool) -> None:
    """Entries, bytes, hits, misses and hit rate (and the remote tier's counts)."""
    if remote:
        return cache_remote.stats(as_json)
    try:
        s = _api().stats()
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        rate = "-" if d["hit_rate"] is None else f"{d['hit_rate'] * 100:.1f}%"
        return (f"path       {d['path']}\nentries    {d['entries']}\n"
                f"bytes      {d['bytes']} ({_size(d['bytes'])}; {_size(d['disk_bytes'])} on disk, "
                f"limit {_size(d['size_limit'])})\n"
                f"hits       {d['hits']}\nmisses     {d['misses']}\nhit rate   {rate}"
                + ("\nread-only  yes (new results are not stored here)" if d["read_only"] else "")
                + (f"\nunreadable {d['unreadable']} rows kjit did not write (`kjit cache verify` "
                   "removes them)" if d["unreadable"] else "")
                + (f"\nunstorable {d['unstorable']} results returned but not stored (a header "
                   "changed while it compiled)" if d.get("unstorable") else "")
                + _sources_line(d.get("sources") or {})
                + _pch_line(d.get("pch") or {})
                + cache_remote.local_lines(d))
    emit(s, as_json, text)


def _sources_line(d: dict) -> str:
    """The kept sources' line (docs/debugging.md), where there are any or one failed."""
    if not d.get("files") and not d.get("failed"):
        return ""
    failed = f"; {d['failed']} could not be written" if d.get("failed") else ""
    return f"\nsources    {d.get('files', 0)} kept for debuggers ({_size(d.get('bytes', 0))}{failed})"


def _pch_line(d: dict) -> str:
    """The precompiled headers' line (docs/headers.md), where there are any."""
    if not d.get("files"):
        return ""
    return (f"\npch        {d['files']} precompiled headers ({_size(d.get('bytes', 0))}, "
            "within the limit)")


@cache_group.command("clear")
@yes_option
@click.option("--remote", is_flag=True, help="Clear the remote (shared) cache instead, for every node.")
@json_option
def clear_cmd(yes: bool, remote: bool, as_json: bool) -> None:
    """Remove every entry (asks first on a terminal; --yes elsewhere)."""
    if remote:
        return cache_remote.clear(yes, as_json)
    confirm_removal(f"every entry of the local cache in {_api().path()}", yes, as_json)
    from ..cache import clear_report
    try:
        r = clear_report()
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        if d["reset"]:
            return f"the cache databases could not be read ({d['reason']}); removed them"
        return f"removed {d['removed']} entries" + (
            f" and {d['unreadable_removed']} unreadable rows" if d["unreadable_removed"] else "")
    emit(r, as_json, text)


@cache_group.command("prune")
@click.option("--max-size", help="Evict least-recently-used entries until the cache fits (e.g. 500M).")
@click.option("--older-than", help="Remove entries not used for this long (e.g. 30d, 12h).")
@json_option
def prune_cmd(max_size, older_than, as_json: bool) -> None:
    """Remove old entries and/or shrink the cache to a size (on a full disk too)."""
    with usage_errors():
        from ..cache import prune_limits as limits
        limits(max_size, older_than)
    try:
        r = _api().prune(max_size=max_size, older_than=older_than)
    except KjitError as exc:
        raise fail(exc)
    emit(r, as_json, lambda d: f"removed {d['removed']} entries ({_size(d['bytes_freed'])}); "
                               f"{d['entries_left']} left" + (
                                   f"; {d['sources_removed']} kept sources no entry names"
                                   if d.get("sources_removed") else ""))


@cache_group.command("verify")
@json_option
def verify_cmd(as_json: bool) -> None:
    """Check every entry's checksum; corrupt entries and rows kjit did not write are removed
    (exit 1 if there were any)."""
    try:
        r = _api().verify()
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        lines = [f"checked {d['checked']}: {d['ok']} ok, {len(d['corrupt'])} corrupt (removed)"
                 + (f"; {d['unreadable']} unreadable rows removed" if d["unreadable"] else "")]
        lines += [f"  {c['key'][:16]}  {c['error']}" for c in d["corrupt"]]
        return "\n".join(lines)
    emit(r, as_json, text)
    if r["corrupt"] or r["unreadable"]:
        raise SystemExit(1)


@cache_group.command("export")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--key", "keys", multiple=True, help="Export only this entry (repeatable; prefixes ok).")
@json_option
def export_cmd(file: str, keys, as_json: bool) -> None:
    """Write entries to FILE (one zip; - for standard output) for `kjit cache import` on
    another machine."""
    if file == "-" and as_json:
        raise click.UsageError("FILE - and --json both write to standard output: use one")
    try:
        r = _api().export(file, keys=list(keys) or None)
    except KjitError as exc:
        raise fail(exc)
    emit(r, as_json, lambda d: f"exported {d['exported']} entries to {d['file']}"
         + (f" ({_size(d['bytes'])})" if d["bytes"] else ""), err=file == "-")


@cache_group.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--overwrite", is_flag=True, help="Replace entries that are already present.")
@json_option
def import_cmd(file: str, overwrite: bool, as_json: bool) -> None:
    """Add the entries in FILE (from `kjit cache export`), checking every checksum."""
    try:
        r = _api().import_(file, overwrite=overwrite)
    except KjitError as exc:
        raise fail(exc)

    def text(d):
        lines = [f"imported {d['imported']} entries ({d['already_present']} already present, "
                 f"{len(d['rejected'])} rejected)"]
        lines += [f"  rejected {c['key'][:16]}: {c['error']}" for c in d["rejected"]]
        return "\n".join(lines)
    emit(r, as_json, text)
    if r["rejected"]:
        raise SystemExit(1)


cache_group.add_command(cache_remote.push_cmd)
