"""`kjit cache ls` and `stats` over thousands of entries, parsing the metadata of only the
rows they return.

The usage database holds, per entry, its metadata as JSON text ("meta:K"), its last use
("used:K"), hit count ("hits:K") and code size ("size:K"). The common listing (no filter,
sorted by last use, hits or size) sorts those numbers in Python and reads the metadata of
the first page only; filters and the other sorts are done by SQLite over the JSON. Entries
whose metadata is missing or damaged (imported by an older kjit, a foreign row) are read
the slow way, from the entry itself, and merged in.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from .tables import Table

NUMERIC_SORTS = ("created", "last_used", "size", "hits")
_BY_NUMBER_ROW = {"last_used": "used:", "hits": "hits:", "size": "size:"}
_META = "m.key >= 'meta:' AND m.key < 'meta;' AND m.raw = 1 AND m.mode = 1"


def sort_key(sort: str):
    """Numbers descending (None as 0), text ascending; `reverse` flips the result."""
    if sort in NUMERIC_SORTS:
        def number(r: dict[str, Any]) -> float:
            v = r.get(sort)
            return v if isinstance(v, (int, float)) else 0
        return number
    return lambda r: str(r.get(sort) or "")


def matches(meta: dict[str, Any], kernel: str | None, arch: str | None) -> bool:
    if arch and meta.get("arch") != arch:
        return False
    if kernel:
        symbols = meta.get("symbols") if isinstance(meta.get("symbols"), dict) else {}
        kernels = meta.get("kernels") if isinstance(meta.get("kernels"), list) else []
        names = [*kernels, *symbols.keys(), *symbols.values(), meta.get("label") or ""]
        return any(isinstance(n, str) and kernel in n for n in names)
    return True


def rows(store: Any, *, kernel: str | None, arch: str | None, sort: str, reverse: bool,
         limit: int | None) -> list[dict[str, Any]]:
    """Entries' metadata, filtered and sorted, at most `limit` of them (0/None: all)."""
    entries, usage = store.tables()
    live = entries.keys()
    # (keys whose place only their metadata tells, keys already in order)
    unranked, ranked = live, []
    if kernel or arch or sort not in _BY_NUMBER_ROW:
        try:
            unranked, ranked = _sql_order(usage, live, kernel, arch, sort, reverse)
        except sqlite3.OperationalError:  # malformed JSON, or an SQLite without JSON functions:
            pass                           # every entry is read and sorted below
    else:
        unranked, ranked = _number_order(usage, live, _BY_NUMBER_ROW[sort], reverse)
    out: list[dict[str, Any]] = []
    for k in unranked:
        _add(out, _meta(store, usage, k), kernel, arch)
    taken = 0
    for k in ranked:
        if limit and taken >= limit:
            break  # the rest rank below `limit` entries already taken
        taken += _add(out, _meta(store, usage, k), kernel, arch)
    # The order above is SQLite's or the numbers'; this sort makes it exact (the metadata
    # of entries read the slow way included) and stable.
    out.sort(key=sort_key(sort), reverse=sort in NUMERIC_SORTS)
    if reverse:
        out.reverse()
    return out[:limit] if limit else out


def _add(out: list[dict[str, Any]], meta: dict[str, Any] | None, kernel: str | None,
         arch: str | None) -> bool:
    if meta is None or not matches(meta, kernel, arch):
        return False
    meta.pop("source", None)
    out.append(meta)
    return True


def _number_order(usage: Table, live: list[str], prefix: str,
                  reverse: bool) -> tuple[list[str], list[str]]:
    """(keys without a numeric usage row under `prefix`, the others by it, largest first):
    an entry an older kjit wrote has no "size:" row, and its metadata decides its place."""
    values = usage.numbers(prefix)
    missing = [k for k in live if k not in values]
    ranked = sorted((k for k in live if k in values), key=values.__getitem__, reverse=not reverse)
    return missing, ranked


def _sql_order(usage: Table, live: list[str], kernel: str | None, arch: str | None, sort: str,
               reverse: bool) -> tuple[list[str], list[str]]:
    """(keys whose metadata SQLite cannot see, the others filtered (a superset: `matches`
    decides) and ordered by SQLite)."""
    where, params = [_META], []
    if arch:
        where.append("json_extract(m.value, '$.arch') = ?")
        params.append(arch)
    if kernel and kernel.isascii():  # a prefilter only: JSON escapes non-ASCII text
        where.append("instr(m.value, ?) > 0")
        params.append(json.dumps(kernel)[1:-1])
    join, expr = "", f"json_extract(m.value, '$.{sort}')"
    if sort in ("last_used", "hits"):
        join = (f"LEFT JOIN Cache AS u ON u.key = '{_BY_NUMBER_ROW[sort]}' || substr(m.key, 6) "
                "AND u.raw = 1 ")
        expr = f"coalesce(u.value, {expr if sort == 'last_used' else 0})"
    descending = (sort in NUMERIC_SORTS) != reverse
    ordered = [k for (k,) in usage.sql(
        f"SELECT substr(m.key, 6) FROM Cache AS m {join}"
        f"WHERE {' AND '.join(where)} ORDER BY {expr} {'DESC' if descending else 'ASC'}, m.key",
        params)]
    with_meta = {k for (k,) in usage.sql(f"SELECT substr(m.key, 6) FROM Cache AS m WHERE {_META}")}
    alive = set(live)
    return [k for k in live if k not in with_meta], [k for k in ordered if k in alive]


def _meta(store: Any, usage: Table, k: str) -> dict[str, Any] | None:
    """One entry's metadata with its usage: the inline JSON row, else store.meta's way."""
    row = usage.sql("SELECT value FROM Cache WHERE key = ? AND raw = 1 AND mode = 1",
                    ("meta:" + k,)).fetchone()
    try:
        meta = json.loads(row[0]) if row else None
    except (ValueError, RecursionError, TypeError):
        meta = None
    if not isinstance(meta, dict):
        return store.meta(k)
    hits = usage.get_number("hits:" + k)
    used = usage.get_number("used:" + k)
    meta["key"] = k
    meta["hits"] = int(hits or 0)
    meta["last_used"] = used or meta.get("created")
    return meta


def code_sizes(store: Any, keys: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """({key: code bytes} for `keys}, the part of it that had no "size:" row): from the
    "size:K" rows, else (entries an older kjit wrote) from their metadata."""
    _, usage = store.tables()
    sizes = {k: int(v) for k, v in usage.numbers("size:").items()}
    missing = [k for k in keys if k not in sizes]
    found: dict[str, int] = {}
    if missing:
        from_meta = usage.json_numbers("meta:", "size")
        for k in missing:
            v = from_meta.get(k)
            if v is None:
                v = (store.meta(k) or {}).get("size")
            found[k] = int(v) if isinstance(v, (int, float)) else 0
    sizes.update(found)
    return {k: sizes.get(k, 0) for k in keys}, found
