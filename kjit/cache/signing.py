"""Values in a shared tier: the entry bytes of kjit.cache.entry, signed when a key is set.

Every node can write to a shared Redis, and a cubin read from it runs on every GPU, so with
a secret the value is MAGIC (8) | HMAC-SHA256(secret, context + key + entry) (32) | entry.
The cache key is inside the MAC, so a validly signed value cannot be replayed under
another key. Without a secret the value is the entry bytes as they are on disk.
"""
from __future__ import annotations

import hashlib
import hmac

SIG_MAGIC = b"KJITSIG1"
_CONTEXT = b"kjit-remote-value-v1\0"
_MAC_SIZE = 32


class Refused(Exception):
    """A value without a valid signature where one is required; the message says which."""


def _mac(secret: bytes, key: str, blob: bytes | memoryview) -> bytes:
    h = hmac.new(secret, _CONTEXT, hashlib.sha256)
    h.update(key.encode() + b"\0")
    h.update(blob)
    return h.digest()


def sign(secret: bytes | None, key: str, blob: bytes) -> bytes:
    """The value to store for entry bytes `blob` under cache key `key`."""
    if secret is None:
        return blob
    return SIG_MAGIC + _mac(secret, key, blob) + blob


def is_signed(value: bytes) -> bool:
    return value[:len(SIG_MAGIC)] == SIG_MAGIC


def open_value(secret: bytes | None, key: str, value: bytes) -> bytes:
    """The entry bytes inside a stored value; Refused if `secret` is set and the value is not
    signed with it. Without a secret a signed value's MAC cannot be checked: its entry
    bytes are returned, still to be checksummed by kjit.cache.entry."""
    signed = is_signed(value)
    if secret is None:
        return value[len(SIG_MAGIC) + _MAC_SIZE:] if signed else value
    if not signed:
        raise Refused("value is not signed (written by a node without KJIT_REMOTE_CACHE_KEY?)")
    start = len(SIG_MAGIC) + _MAC_SIZE
    body = memoryview(value)[start:]
    if not hmac.compare_digest(value[len(SIG_MAGIC):start], _mac(secret, key, body)):
        raise Refused("signature does not match (another key, or the value was altered)")
    return bytes(body)
