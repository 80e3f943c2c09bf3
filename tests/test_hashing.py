"""kjit.hashing: the digests of hashlib's SHA-256 whichever implementation computes them."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from kjit import hashing

SIZES = [0, 1, 63, 64, 65, 4096, 100_000, hashing.BUILTIN_BUDGET + 1]


@pytest.mark.parametrize("n", SIZES)
def test_same_digest_as_hashlib(n):
    data = os.urandom(n)
    h = hashing.sha256(data)
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert h.digest() == hashlib.sha256(data).digest()
    h.update(b"more")  # the hashlib interface: incremental updates too
    assert h.hexdigest() == hashlib.sha256(data + b"more").hexdigest()


def test_buffers_are_hashed_by_their_bytes():
    data = bytes(range(256)) * 3
    for view in (bytearray(data), memoryview(data), memoryview(bytearray(data)).cast("I")):
        assert hashing.sha256(view).hexdigest() == hashlib.sha256(data).hexdigest()


BUDGET = r'''
import sys
from kjit import hashing
small = hashing.sha256(b"x" * 1000).hexdigest()
before = "hashlib" in sys.modules
big = hashing.sha256(b"y" * (hashing.BUILTIN_BUDGET + 1)).hexdigest()
print(before, "hashlib" in sys.modules, small, big)
'''


@pytest.mark.skipif(hashing._builtin_sha256 is None, reason="this Python has no built-in SHA-256")
def test_openssl_loads_only_past_the_budget():
    """Small inputs never load OpenSSL; past the budget hashlib takes over, same digests."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", BUDGET], capture_output=True, text=True,
                         cwd=root, timeout=60, env=dict(os.environ, PYTHONPATH=root))
    assert out.returncode == 0, out.stderr
    before, after, small, big = out.stdout.split()
    assert (before, after) == ("False", "True")
    assert small == hashlib.sha256(b"x" * 1000).hexdigest()
    assert big == hashlib.sha256(b"y" * (hashing.BUILTIN_BUDGET + 1)).hexdigest()
