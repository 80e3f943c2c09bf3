"""One cache entry as bytes: a checksummed JSON header plus the code. No pickle, ever.

Layout: MAGIC (8) | header length (u32) | code length (u64) | sha256(header + code) (32)
        | header (UTF-8 JSON) | code.
Every part is checked on read, so a flipped bit, a truncated or extended value, a header from
another entry or a foreign blob all raise CorruptEntry instead of returning wrong code.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from ..objectcode import KINDS, ObjectCode

MAGIC = b"KJITENT1"
_PREFIX = struct.Struct("<8sIQ32s")


class CorruptEntry(Exception):
    """A stored entry failed a check; the message says which."""


def encode(key: str, obj: ObjectCode, meta: dict[str, Any]) -> bytes:
    """Bytes for `obj` stored under `key`; `meta` is the JSON metadata shown by `kjit cache show`."""
    header = json.dumps({
        "key": key, "kind": obj.kind, "arch": obj.arch, "name": obj.name, "log": obj.log,
        "symbols": dict(obj.symbols), "metadata": dict(obj.metadata), "meta": meta,
    }, sort_keys=True, separators=(",", ":"), default=str).encode()
    digest = hashlib.sha256(header + obj.code).digest()
    return _PREFIX.pack(MAGIC, len(header), len(obj.code), digest) + header + obj.code


def decode_header(blob: bytes, key: str | None = None) -> tuple[dict[str, Any], bytes]:
    """Check `blob` and return (header, code); CorruptEntry names the failed check."""
    if not isinstance(blob, bytes):
        raise CorruptEntry(f"value is {type(blob).__name__}, not bytes")
    if len(blob) < _PREFIX.size:
        raise CorruptEntry(f"truncated: {len(blob)} bytes is shorter than the entry prefix")
    magic, hlen, clen, digest = _PREFIX.unpack_from(blob)
    if magic != MAGIC:
        raise CorruptEntry("bad magic: not a kjit cache entry")
    if _PREFIX.size + hlen + clen != len(blob):
        raise CorruptEntry(f"length mismatch: header {hlen} + code {clen} bytes declared, "
                           f"{len(blob) - _PREFIX.size} present (truncated or extended)")
    body = memoryview(blob)[_PREFIX.size:]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    try:
        header = json.loads(bytes(body[:hlen]))
    except ValueError as exc:
        raise CorruptEntry(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("kind") not in KINDS:
        raise CorruptEntry("header lacks a valid kind")
    if key is not None and header.get("key") != key:
        raise CorruptEntry(f"entry belongs to key {str(header.get('key'))[:16]}…, not {key[:16]}…")
    return header, bytes(body[hlen:])


def decode(blob: bytes, key: str | None = None) -> tuple[ObjectCode, dict[str, Any]]:
    """(ObjectCode with cache_hit=True, entry metadata) from checked bytes."""
    header, code = decode_header(blob, key)
    try:
        obj = ObjectCode(code, kind=header["kind"], arch=header.get("arch"), log=header.get("log", ""),
                         symbols=header.get("symbols") or {}, name=header.get("name", "<source>"),
                         metadata=header.get("metadata") or {}, cache_hit=True)
    except Exception as exc:  # checksummed but unusable: treat as corrupt, never crash
        raise CorruptEntry(f"entry does not make an ObjectCode: {exc}") from None
    return obj, header.get("meta") or {}
