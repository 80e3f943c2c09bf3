"""SHA-256 for kjit's keys and checksums, without loading OpenSSL for a few kilobytes.

`import hashlib` loads OpenSSL's libcrypto first (~2.5 ms on the dev machine, an eighth of a
fresh process's disk hit, which hashes a few kilobytes). CPython's own SHA-256 (`_sha2`;
`_sha256` before 3.12) gives the same digests with nothing to load, at about a sixth of
OpenSSL's speed. So a process hashes its first BUILTIN_BUDGET bytes with it, and anything
after that, or any input once hashlib is loaded anyway, through hashlib.
"""
from __future__ import annotations

import sys
from typing import Any

# ~1 ms of hashing on the dev machine (3.11), ~2 ms on 3.12's slower one: about what the
# import it saves costs. A fresh process's disk hit hashes a few tens of kilobytes.
BUILTIN_BUDGET = 256 << 10

try:
    from _sha2 import sha256 as _builtin_sha256  # CPython 3.12+
except ImportError:
    try:
        from _sha256 import sha256 as _builtin_sha256  # CPython 3.10, 3.11
    except ImportError:  # another Python, or a build without it: hashlib does it all
        _builtin_sha256 = None

_budget_left = BUILTIN_BUDGET


def sha256(data: bytes | bytearray | memoryview = b"") -> Any:
    """A hashlib-style SHA-256 object (digest, hexdigest, update) over `data`."""
    global _budget_left
    n = memoryview(data).nbytes
    if _builtin_sha256 is not None and n <= _budget_left and "hashlib" not in sys.modules:
        _budget_left -= n   # a race between threads only misjudges the budget a little
        return _builtin_sha256(data)
    import hashlib
    return hashlib.sha256(data)
