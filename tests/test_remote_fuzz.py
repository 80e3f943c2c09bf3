"""Property-based fuzzing of what kjit reads from a shared server, with a time and memory
bound per input: the value reader (signature, entry header, payload), the listing's header
reader, the socket guard's RESP framing, and redis-py's parsing of arbitrary replies."""
from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("redis", reason="the Redis backend's guard needs redis-py: pip install 'kjit[redis]'")

from kjit.cache import admin, entry, redis_backend, remote, shared  # noqa: E402
from kjit.objectcode import ObjectCode  # noqa: E402

KEY = "ab" * 32
SECRET = b"fuzz secret"
FAST = settings(max_examples=200, deadline=1000, suppress_health_check=[HealthCheck.too_slow])


class OneValue(remote.RemoteTier):
    """A tier holding one value: what the fuzzer gives."""
    url = "fuzz://"

    def __init__(self, value: bytes):
        self.value = value

    def get(self, key, ttl_s):
        return self.value

    def put(self, key, value, ttl_s, *, overwrite=True):
        return True

    def lease(self, key, ttl_s):
        return None

    def watch(self, key):
        raise NotImplementedError

    def stats(self):
        return {}

    def keys(self):
        return iter([KEY])

    def peek(self, keys, size):
        return [(self.value[:size], None) for _ in keys]

    def sizes(self, keys):
        return [len(self.value) for _ in keys]

    def delete(self, keys):
        return 0

    def clear(self):
        return 0

    def keys(self):
        return iter(())

    def peek(self, keys, size):
        return []

    def sizes(self, keys):
        return []

    def delete(self, keys):
        return 0


def _entry(tag: str) -> bytes:
    text = f".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry {tag}()\n{{\nret;\n}}\n"
    return entry.encode(KEY, ObjectCode(text.encode(), kind="ptx", name=tag),
                        {"kernels": [tag], "created": 1.0})


@st.composite
def mutated(draw) -> bytes:
    """A real (signed or unsigned) value, then cut, extended, overwritten or spliced."""
    blob = _entry(draw(st.sampled_from(["k", "kernel_with_a_longer_name"])))
    if draw(st.booleans()):
        blob = shared.sign(SECRET, KEY, blob)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["cut", "extend", "flip", "splice"]))
        at = draw(st.integers(0, max(len(blob) - 1, 0)))
        if op == "cut":
            blob = blob[:at]
        elif op == "extend":
            blob += draw(st.binary(max_size=64))
        elif op == "flip":
            blob = blob[:at] + bytes([blob[at] ^ draw(st.integers(1, 255))]) + blob[at + 1:] if blob else blob
        else:
            blob = blob[:at] + draw(st.binary(max_size=32)) + blob[at:]
    return blob


VALUES = st.one_of(st.binary(max_size=2048), mutated(),
                   st.builds(lambda b: shared.NO_VALUE + b, st.binary(max_size=64)),
                   st.builds(lambda b: shared.SIG_MAGIC + b, st.binary(max_size=128)))


def bounded(fn, size: int):
    """fn() with a memory bound of a few times the input."""
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * size + (1 << 20), f"{peak} bytes allocated for a {size}-byte input"
    return out


@FAST
@given(value=VALUES, secret=st.sampled_from([None, SECRET]))
def test_the_value_reader_never_raises_and_never_serves_an_unchecked_value(value, secret):
    tier = shared.SharedTier(remote.RemoteConfig(url="redis://x/0", secret=secret, unsigned_ok=True),
                             OneValue(value))
    tier._warn_once = lambda *a: None
    found = bounded(lambda: tier._fetch(KEY, "fuzz", set()), len(value))
    if found is None or found is shared.NO_VALUE:
        return
    obj, meta = found
    body = value[len(shared.SIG_MAGIC) + 32:] if shared.is_signed(value) else value
    assert isinstance(obj, ObjectCode) and isinstance(meta, dict)
    entry.decode_header(body, KEY)  # what was served passed every check
    if secret is not None:  # and, with a key, carried a valid signature
        assert shared.open_value(secret, KEY, value) == body


@FAST
@given(head=st.one_of(st.none(), VALUES), ttl=st.one_of(st.none(), st.floats(0, 1e9)))
def test_the_listing_reader_never_raises(head, ttl):
    row = bounded(lambda: admin._row(KEY, head, ttl), len(head or b""))
    if row is None:
        return
    assert row["key"] == KEY
    for field in ("kind", "arch", "name", "namespace", "label"):
        assert row.get(field) is None or isinstance(row[field], str)
    assert all(isinstance(n, str) for n in row.get("kernels") or [])
    assert row.get("created") is None or isinstance(row["created"], (int, float))


class _Chunks:
    """A socket whose reads return the given chunks, then end of stream."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def recv(self, n, flags=0):
        return self.chunks.pop(0) if self.chunks else b""

    def gettimeout(self):
        return 1.0

    def settimeout(self, t):
        pass


def _read_all(chunks, bulk_max: int) -> bool:
    """Whether the guard refused the stream `chunks`."""
    guard = redis_backend.GuardedSocket(_Chunks(chunks))
    with redis_backend.request(5.0, bulk_max=bulk_max, reply_max=1 << 30) as req:
        try:
            for _ in chunks:
                guard.recv(4096)
        except redis_backend.Refused:
            assert req.refused
            return True
    return False


@FAST
@given(chunks=st.lists(st.one_of(st.binary(max_size=64),
                                 st.builds(lambda n: b"$%d\r\n" % n, st.integers(-5, 1 << 40))),
                       max_size=20),
       bulk_max=st.integers(0, 4096))
def test_the_socket_guard_takes_any_bytes(chunks, bulk_max):
    _read_all(chunks, bulk_max)  # refuses or not; raises nothing else


@FAST
@given(replies=st.lists(st.one_of(
           st.builds(lambda b: b"$%d\r\n%s\r\n" % (len(b), b), st.binary(max_size=300)),
           st.builds(lambda n: b"$%d\r\n" % n, st.integers(300, 1 << 40)),  # announced, never sent
           st.just(b"$-1\r\n"), st.just(b":12\r\n"), st.just(b"*2\r\n"), st.just(b"+OK\r\n")),
           min_size=1, max_size=8),
       cuts=st.lists(st.integers(1, 97), max_size=20), bulk_max=st.integers(0, 400))
def test_the_socket_guard_refuses_exactly_the_strings_over_its_cap(replies, cuts, bulk_max):
    stream = b"".join(replies)
    over = False
    for r in replies:  # the reference: the first string over the cap, before any unsent body
        if r.startswith(b"$") and int(r[1:r.index(b"\r")]) > bulk_max:
            over = True
            break
        if r.startswith(b"$") and r.endswith(b"\r\n") and r.count(b"\r\n") == 1 and r != b"$-1\r\n":
            break  # announced but not sent: the rest of the stream is its body
    chunks, at = [], 0
    for c in cuts:
        if at >= len(stream):
            break
        chunks.append(stream[at:at + c])
        at += c
    if at < len(stream):
        chunks.append(stream[at:])
    assert _read_all(chunks, bulk_max) == over


@pytest.fixture(scope="module")
def fake_server():
    from fake_resp import FakeRedis
    state = {"reply": b"$-1\r\n"}
    server = FakeRedis(lambda cmd: state["reply"] if cmd[0].upper() in (b"GET", b"GETEX") else None)
    server.state = state
    yield server
    server.close()


@settings(max_examples=60, deadline=3000, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(reply=st.one_of(
    st.binary(max_size=256),
    st.builds(lambda t, b: t + b, st.sampled_from([b"$", b"*", b"%", b"~", b">", b"|", b"=", b"!", b":",
                                                  b",", b"#", b"(", b"_", b"+", b"-"]),
              st.binary(max_size=64)),
    st.builds(lambda n, b: b"$%d\r\n" % n + b, st.integers(-3, 1 << 40), st.binary(max_size=64))))
def test_any_reply_to_get_is_a_value_or_a_tier_error(fake_server, reply):
    pytest.importorskip("redis")
    from kjit.cache.redis_backend import RedisTier
    fake_server.state["reply"] = reply
    tier = RedisTier(fake_server.url, prefix="kjit:1:", timeout_s=0.1, max_value=1024)
    try:
        import time
        t0 = time.monotonic()
        try:
            got = bounded(lambda: tier.get(KEY, 0), 1 << 16)
        except (remote.TierError, entry.CorruptEntry):
            got = None
        assert time.monotonic() - t0 < 0.1 * 3 + 2.0   # bounded, not hung: slack for a loaded runner
        assert got is None or (isinstance(got, bytes) and len(got) <= 1024 + 64)
    finally:
        tier.close()
