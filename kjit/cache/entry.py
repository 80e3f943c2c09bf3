"""One cache entry as bytes: a checksummed JSON header plus the code. No pickle, ever.

Layout: MAGIC (8) | header length (u32) | code length (u64) | sha256(header + code) (32)
        | header (UTF-8 JSON) | code.
Every part is checked on read, so a flipped bit, a truncated or extended value, a header from
another entry or a foreign blob all raise CorruptEntry instead of returning wrong code.
"""
from __future__ import annotations

import json
import struct
from typing import Any

from ..formats import KINDS
from ..hashing import sha256
from ..objectcode import ObjectCode

MAGIC = b"KJITENT1"
_PREFIX = struct.Struct("<8sIQ32s")
PREFIX_SIZE = _PREFIX.size


class CorruptEntry(Exception):
    """A stored entry failed a check; the message says which."""


def encode(key: str, obj: ObjectCode, meta: dict[str, Any]) -> bytes:
    """Bytes for `obj` stored under `key`; `meta` is the JSON metadata shown by `kjit cache show`."""
    header = json.dumps({
        "key": key, "kind": obj.kind, "arch": obj.arch, "name": obj.name, "log": obj.log,
        "symbols": dict(obj.symbols), "metadata": dict(obj.metadata), "meta": meta,
    }, sort_keys=True, separators=(",", ":"), default=str).encode()
    digest = sha256(header + obj.code).digest()
    return _PREFIX.pack(MAGIC, len(header), len(obj.code), digest) + header + obj.code


def code_length(blob: bytes) -> int:
    """The code length an encoded entry declares (checked by decode_header, not here)."""
    return _PREFIX.unpack_from(blob)[2]


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
    if sha256(body).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    try:
        header = json.loads(bytes(body[:hlen]))
    except (ValueError, RecursionError) as exc:  # deep nesting: RecursionError
        raise CorruptEntry(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or header.get("kind") not in KINDS:
        raise CorruptEntry("header lacks a valid kind")
    _check_types(header)
    if key is not None and header.get("key") != key:
        raise CorruptEntry(f"entry belongs to key {str(header.get('key'))[:16]}…, not {key[:16]}…")
    return header, bytes(body[hlen:])


# A checksum is no signature: a crafted entry can pass it, so every field's type is checked
# before anything reads it.
_FIELD_TYPES = {"key": (str,), "arch": (str, type(None)), "name": (str,), "log": (str,),
                "symbols": (dict,), "metadata": (dict,), "meta": (dict,)}


def _check_types(header: dict[str, Any]) -> None:
    header.setdefault("symbols", {})
    header.setdefault("metadata", {})
    header.setdefault("meta", {})
    header.setdefault("log", "")
    header.setdefault("name", "<source>")
    for name, types in _FIELD_TYPES.items():
        if name in header and not isinstance(header[name], types):
            raise CorruptEntry(f"header field {name!r} is {type(header[name]).__name__}")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in header["symbols"].items()):
        raise CorruptEntry("header symbols are not names")


def declared_lengths(head: bytes) -> tuple[int, int]:
    """(header bytes, code bytes) that an entry's first PREFIX_SIZE bytes declare, checking
    only the magic: for listings that read a header without fetching the code."""
    if len(head) < _PREFIX.size or head[:len(MAGIC)] != MAGIC:
        raise CorruptEntry("not a kjit cache entry")
    _, hlen, clen, _ = _PREFIX.unpack_from(head)
    return hlen, clen


def decode(blob: bytes, key: str | None = None) -> tuple[ObjectCode, dict[str, Any]]:
    """(ObjectCode with cache_hit=True, entry metadata) from checked bytes."""
    header, code = decode_header(blob, key)
    try:
        obj = ObjectCode.from_checked(code, header["kind"], header.get("arch"), header["log"],
                                      header["symbols"], header["name"], header["metadata"], True)
    except Exception as exc:  # checksummed but unusable: treat as corrupt, never crash
        raise CorruptEntry(f"entry does not make an ObjectCode: {exc}") from None
    return obj, header["meta"]
