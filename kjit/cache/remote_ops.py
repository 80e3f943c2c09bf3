"""What `kjit cache ls/stats/clear --remote` and `kjit cache push` do, as functions."""
from __future__ import annotations

import json
from typing import Any

from . import entry as entry_mod
from . import remote, shared, signing
from .remote import TierError
from .shared import COUNTERS, NO_VALUE
from ..errors import KjitError

_HEAD = 4096  # bytes read per value for a listing: most headers fit


def _tier():
    config = remote.RemoteConfig.from_env()
    if config is not None and config.refusal:
        raise KjitError(config.refusal)
    tier = shared.active()
    if tier is None:
        raise KjitError(f"no remote cache is configured: set {remote.ENV_URL}=redis://host:port/db "
                        "(or call kjit.cache.configure_remote(url))")
    return tier


def _unusable(tier, exc: Exception) -> KjitError:
    return KjitError(f"the remote cache {tier.config.display_url} cannot be used: {exc}")


def _row(key: str, head: bytes | None, ttl: float | None) -> dict[str, Any] | None:
    """A listing row from a value's first bytes, or None when they are not a whole header."""
    if head is None:
        return None
    if head.startswith(NO_VALUE):
        return {"key": key, "note": "not shared: " + head[len(NO_VALUE):].decode(errors="replace").strip(),
                "ttl_s": ttl}
    signed = signing.is_signed(head)
    body = head[40:] if signed else head
    try:
        hlen, clen = entry_mod.declared_lengths(body)
    except entry_mod.CorruptEntry:
        return {"key": key, "error": "not a kjit cache entry", "signed": signed, "ttl_s": ttl}
    end = entry_mod.PREFIX_SIZE + hlen
    if len(body) < end:
        return None
    try:
        header = json.loads(body[entry_mod.PREFIX_SIZE:end])
    except (ValueError, RecursionError):
        return {"key": key, "error": "header is not JSON", "signed": signed, "ttl_s": ttl}
    if not isinstance(header, dict):
        return {"key": key, "error": "header is not a JSON object", "signed": signed, "ttl_s": ttl}
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    kernels = meta.get("kernels")
    created = meta.get("created")
    return {"key": key, "kind": _text(header.get("kind")), "arch": _text(header.get("arch")),
            "size": clen, "name": _text(header.get("name")),
            "namespace": _text(meta.get("namespace")), "label": _text(meta.get("label")),
            "kernels": [n for n in kernels if isinstance(n, str)] if isinstance(kernels, list) else [],
            "created": created if _number(created) else None, "signed": signed, "ttl_s": ttl}


def _text(value: Any) -> str | None:
    """A header field that should be text: anything else (a crafted header) reads as absent."""
    return value if isinstance(value, str) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def ls_remote(*, limit: int | None = None) -> list[dict[str, Any]]:
    """The shared tier's entries (unverified headers: the checks run when one is fetched),
    newest first: key, kind, arch, size, name, kernels, created, signed, seconds to live."""
    tier = _tier()
    try:
        keys = sorted(tier.backend.keys())
        heads = tier.backend.peek(keys, _HEAD)
        rows = [_row(k, h, t) for k, (h, t) in zip(keys, heads)]
        longer = [i for i, r in enumerate(rows) if r is None and heads[i][0] is not None]
        if longer:  # headers past the first read (long logs): read those values' heads again
            again = tier.backend.peek([keys[i] for i in longer], 1 << 20)
            for i, (h, t) in zip(longer, again):
                rows[i] = _row(keys[i], h, t) or {"key": keys[i], "error": "header too long to list",
                                                  "signed": signing.is_signed(h or b""), "ttl_s": t}
    except TierError as exc:
        raise _unusable(tier, exc) from None
    out = [r for r in rows if r is not None]
    out.sort(key=lambda r: r.get("created") or 0, reverse=True)  # numbers only (_row)
    return out[:limit] if limit else out


def stats_remote() -> dict[str, Any]:
    """The shared tier: where, how configured, what it holds, the server's memory, and this
    process's counts."""
    tier = _tier()
    cfg = tier.config
    try:
        server = tier.backend.stats()
        keys = list(tier.backend.keys())
        total = sum(tier.backend.sizes(keys))
    except TierError as exc:
        raise _unusable(tier, exc) from None
    return {"url": cfg.display_url, "prefix": cfg.prefix, "signed": cfg.secret is not None,
            "ttl_s": cfg.ttl_s, "max_value": cfg.max_value, "entries": len(keys), "bytes": total,
            "server": server, "session": {k: tier.counts.get(k, 0) for k in COUNTERS}}


def clear_remote() -> int:
    """Remove every value (and lease) under the tier's prefix; returns how many values."""
    tier = _tier()
    try:
        return tier.backend.clear()
    except TierError as exc:
        raise _unusable(tier, exc) from None


def push(*, keys: list[str] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Upload local entries (all, or `keys`) to the shared tier, e.g. after a `kjit build` in
    CI, so that a cluster starts warm. Each is checked first; corrupt and too-large ones are
    skipped; values already there are kept unless overwrite."""
    from .ops import _disk, resolve_key
    tier = _tier()
    cfg = tier.config
    disk = _disk()
    chosen = [resolve_key(k) for k in keys] if keys else disk.keys()
    pushed, present, too_large, skipped, sent = 0, 0, 0, [], 0
    for k in chosen:
        blob = disk.get_blob(k)
        if blob is None:
            continue
        try:
            entry_mod.decode_header(blob, k)
        except entry_mod.CorruptEntry as exc:
            skipped.append({"key": k, "error": str(exc)})
            continue
        if len(blob) > cfg.max_value:
            too_large += 1
            continue
        try:
            stored = tier.backend.put(k, signing.sign(cfg.secret, k, blob), cfg.ttl_s, overwrite=overwrite)
        except TierError as exc:
            raise _unusable(tier, exc) from None
        if stored:
            pushed += 1
            sent += len(blob)
        else:
            present += 1
    return {"url": cfg.display_url, "pushed": pushed, "already_present": present,
            "too_large": too_large, "skipped": skipped, "bytes": sent, "signed": cfg.secret is not None}
