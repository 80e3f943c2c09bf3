"""The shared tier on a real redis-server: a compile on one node is a hit on another; values
are checked (checksum, kind, key, signature) and anything wrong is a counted miss, never a
wrong binary; the configuration and `kjit info`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import kjit
import kjit.cache
from kjit.cache import CacheWarning, entry, remote, shared
from kjit.errors import InvalidOptionError, KjitError
from kjit.objectcode import ObjectCode
from cache_nodes import lookup_in, node, ptx

REPO = Path(__file__).resolve().parents[1]
NS = "remote-test"


def lookup(tag: str, created: list | None = None) -> ObjectCode:
    return lookup_in(NS, tag, created)

# One "node" in its own process: compiles with NVRTC through the cache and reports what the
# cache did (its events), the code's digest, and whether redis-py was loaded.
NODE = r'''
import hashlib, json, sys
import kjit, kjit.cache
events = []
kjit.cache.add_listener(lambda e: events.append(e.event))
obj = kjit.compile(sys.argv[1], arch="sm_90")
print(json.dumps({"hit": obj.cache_hit, "events": events, "redis": "redis" in sys.modules,
                  "sha": hashlib.sha256(obj.code).hexdigest()}))
'''


def run_node(cache_dir: Path, source: str, **env: str) -> dict:
    full = dict(os.environ, KJIT_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **env)
    for name, value in env.items():
        if value is None:
            full.pop(name)
    proc = subprocess.run([sys.executable, "-c", NODE, source], env=full, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def tier():
    return shared.active()


def value_name(tag: str) -> str:
    from kjit.cache.key import key_hash
    return f"{tier().config.prefix}e:{key_hash(NS, {'tag': tag})}"


def test_a_compile_on_one_node_is_a_hit_on_another(remote_env, tmp_path, saxpy_src):
    src = saxpy_src + "\n// two nodes\n"
    first = run_node(tmp_path / "node-a", src)
    second = run_node(tmp_path / "node-b", src)
    assert first["events"] == ["miss"] and first["hit"] is False
    assert second["events"] == ["remote_hit"] and second["hit"] is True
    assert second["sha"] == first["sha"]
    # the hit was written to node b's disk: without the tier it is a local disk hit
    third = run_node(tmp_path / "node-b", src, KJIT_REMOTE_CACHE=None)
    assert third["events"] == ["disk_hit"] and third["sha"] == first["sha"]
    assert not third["redis"], "a disk hit without the tier imported redis"


def test_a_disk_hit_with_the_tier_configured_does_not_load_redis(remote_env, tmp_path, saxpy_src):
    src = saxpy_src + "\n// disk hit\n"
    run_node(tmp_path / "node", src)
    again = run_node(tmp_path / "node", src)
    assert again["events"] == ["disk_hit"] and not again["redis"]


def test_compile_results_are_written_to_both_tiers_and_counted(remote_env, tmp_path, monkeypatch):
    node(monkeypatch, tmp_path, "a")
    created: list = []
    assert lookup("both", created).cache_hit is False
    assert kjit.cache.ls()[0]["label"] == "both"          # local disk
    assert remote_env.client().exists(value_name("both"))  # shared tier
    a = kjit.cache.stats()["remote"]
    assert (a["misses"], a["puts"], a["hits"], a["url"]) == (1, 1, 0, remote_env.url)
    node(monkeypatch, tmp_path, "b")
    assert lookup("both", created).cache_hit is True and created == ["both"]
    b = kjit.cache.stats()["remote"]
    assert (b["misses"], b["puts"], b["hits"]) == (0, 0, 1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "other_key", "list", "junk"])
def test_a_damaged_value_is_a_counted_miss_and_gets_replaced(remote_env, tmp_path, monkeypatch, damage):
    node(monkeypatch, tmp_path, "a")
    lookup("victim")
    lookup("other")
    r = remote_env.client()
    name = value_name("victim")
    good = r.get(name)
    if damage == "flip":
        r.setrange(name, len(good) - 20, bytes([good[-20] ^ 0x01]))
    elif damage == "truncate":
        r.set(name, good[:-7])
    elif damage == "extend":
        r.append(name, b"\0")
    elif damage == "other_key":  # a valid entry, but another key's
        r.set(name, r.get(value_name("other")))
    elif damage == "list":      # not even a string
        r.delete(name)
        r.rpush(name, b"x")
    else:
        r.set(name, b"#!/bin/sh\nrm -rf /\n")
    node(monkeypatch, tmp_path, "b")
    created: list = []
    with pytest.warns(CacheWarning, match="corrupt"):
        obj = lookup("victim", created)
    assert created == ["victim"] and obj.cache_hit is False and b".entry victim()" in obj.code
    assert tier().counts["corrupt"] == 1
    # the new compile replaced the damaged value with a good one
    replaced, _ = entry.decode(r.get(name), name.rsplit(":", 1)[1])
    assert replaced.code == ptx("victim").code
    node(monkeypatch, tmp_path, "c")
    assert lookup("victim", created).cache_hit is True and created == ["victim"]


def test_signed_values(remote_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    node(monkeypatch, tmp_path, "a")
    lookup("signed")
    raw = remote_env.client().get(value_name("signed"))
    assert raw.startswith(b"KJITSIG1")
    node(monkeypatch, tmp_path, "b")
    created: list = []
    assert lookup("signed", created).cache_hit is True and created == []
    # a reader without the key still checks the entry's checksum and can use it
    monkeypatch.delenv(remote.ENV_KEY)
    node(monkeypatch, tmp_path, "c")
    assert lookup("signed", created).cache_hit is True and created == []


@pytest.mark.parametrize("writer_key", [None, "another secret"])
def test_a_value_without_a_valid_signature_is_refused(remote_env, tmp_path, monkeypatch, writer_key):
    if writer_key:
        monkeypatch.setenv(remote.ENV_KEY, writer_key)
    node(monkeypatch, tmp_path, "a")
    lookup("forged")
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    node(monkeypatch, tmp_path, "b")
    created: list = []
    with pytest.warns(CacheWarning, match="refused"):
        obj = lookup("forged", created)
    assert created == ["forged"] and obj.cache_hit is False
    assert tier().counts["refused"] == 1
    kjit.cache.stats()  # flushes the counts to this node's usage database
    assert kjit.cache.stats()["remote"]["refused"] == 1
    # the node's own compile replaced it with a value signed with the right key
    node(monkeypatch, tmp_path, "c")
    assert lookup("forged", created).cache_hit is True and created == ["forged"]


def test_a_signed_value_moved_to_another_key_is_refused(remote_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    node(monkeypatch, tmp_path, "a")
    lookup("one")
    lookup("two")
    r = remote_env.client()
    r.set(value_name("two"), r.get(value_name("one")))
    node(monkeypatch, tmp_path, "b")
    with pytest.warns(CacheWarning, match="refused"):
        assert b".entry two()" in lookup("two").code


def test_values_over_the_limit_stay_local(remote_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_MAX_VALUE, "200")
    node(monkeypatch, tmp_path, "a")
    assert lookup("big").cache_hit is False
    assert tier().counts["too_large"] == 1
    assert kjit.cache.ls()[0]["label"] == "big"
    # only a marker is shared, telling the other nodes not to wait for this one
    assert remote_env.client().get(value_name("big")).startswith(b"KJITNONE")
    node(monkeypatch, tmp_path, "b")
    created: list = []
    assert lookup("big", created).cache_hit is False and created == ["big"]
    assert [r.get("note") for r in kjit.cache.ls_remote()] == ["not shared: too large to share"]


def test_ttl_and_prefix(remote_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_PREFIX, "team-a:kjit:")
    monkeypatch.setenv(remote.ENV_TTL, "1h")
    node(monkeypatch, tmp_path, "a")
    lookup("ttl")
    r = remote_env.client()
    (name,) = r.keys("team-a:kjit:e:*")
    assert 3500 < r.ttl(name) <= 3600
    r.expire(name, 100)
    node(monkeypatch, tmp_path, "b")
    lookup("ttl")
    assert r.ttl(name) > 3500, "a hit did not refresh the TTL"


def test_the_default_prefix_has_the_schema_version():
    from kjit.cache.key import SCHEMA_VERSION
    assert remote.DEFAULT_PREFIX == f"kjit:{SCHEMA_VERSION}:"


def test_user_and_password_in_the_url(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    r = redis_server.client()
    r.execute_command("ACL", "SETUSER", "kjit", "on", ">s3cret", "~kjit:*", "&kjit:*", "+@all")
    r.execute_command("ACL", "SETUSER", "default", "off")
    monkeypatch.setenv(remote.ENV_URL, f"redis://kjit:s3cret@127.0.0.1:{redis_server.port}/0")
    node(monkeypatch, tmp_path, "a")
    lookup("auth")
    node(monkeypatch, tmp_path, "b")
    assert lookup("auth").cache_hit is True
    assert "s3cret" not in tier().config.display_url and "***" in tier().config.display_url
    # a wrong password: one warning (without the password), and the local cache carries on
    monkeypatch.setenv(remote.ENV_URL, f"redis://kjit:wrong@127.0.0.1:{redis_server.port}/0")
    node(monkeypatch, tmp_path, "c")
    with pytest.warns(CacheWarning, match="cannot be used") as caught:
        assert lookup("auth").cache_hit is False
    assert "wrong@" not in str(caught[0].message)


def test_configure_sets_what_child_processes_inherit(redis_server, monkeypatch, tmp_path, saxpy_src):
    for name in remote.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    cfg = kjit.cache.configure_remote(redis_server.url, key="k", ttl="2d", lease="5s")
    assert cfg.ttl_s == 2 * 86400 and cfg.lease_s == 5 and cfg.secret == b"k"
    assert os.environ[remote.ENV_URL] == redis_server.url
    src = saxpy_src + "\n// configure()\n"
    assert run_node(tmp_path / "a", src)["events"] == ["miss"]
    assert run_node(tmp_path / "b", src)["events"] == ["remote_hit"]
    with pytest.raises(InvalidOptionError):
        kjit.cache.configure_remote("ftp://x")
    assert os.environ[remote.ENV_URL] == redis_server.url, "a rejected configure() changed the setting"
    kjit.cache.configure_remote(None)
    assert remote.ENV_URL not in os.environ and shared.active() is None


def test_info_reports_an_unsigned_tier(remote_env, monkeypatch):
    from kjit.cache import describe_remote
    from kjit.cli.info import _remote_text
    r = describe_remote()
    assert r["reachable"] and not r["signed"]
    assert "UNSIGNED" in _remote_text(r)
    monkeypatch.setenv(remote.ENV_KEY, "secret")
    r = describe_remote()
    assert r["signed"] and "signed (HMAC-SHA256)" in _remote_text(r)
    assert "secret" not in json.dumps(r)


def test_without_the_tier_nothing_changes(tmp_path, monkeypatch):
    monkeypatch.delenv(remote.ENV_URL, raising=False)
    assert shared.active() is None
    node(monkeypatch, tmp_path, "a")
    assert lookup("plain").cache_hit is False
    assert kjit.cache.stats()["remote"]["url"] is None
    with pytest.raises(KjitError, match="KJIT_REMOTE_CACHE"):
        kjit.cache.ls_remote()


def test_a_waiter_wakes_when_the_value_is_published(remote_env, tmp_path, monkeypatch):
    """Another node holds the lease; its publication wakes the waiter at once (it does not
    wait for its next check of the lease, a second later)."""
    import threading
    from kjit.cache.key import key_hash
    k = key_hash(NS, {"tag": "woken"})
    other = tier().backend.lease(k, 30)
    node(monkeypatch, tmp_path, "b")
    got: list = []
    waiter = threading.Thread(target=lambda: got.append((lookup("woken"), time.monotonic())))
    waiter.start()
    time.sleep(0.3)
    published = time.monotonic()
    tier().backend.put(k, entry.encode(k, ptx("woken"), {}), 60)
    waiter.join(10)
    other.release()
    obj, done = got[0]
    assert obj.cache_hit is True and b".entry woken()" in obj.code
    assert done - published < 0.4  # its next check of the lease would come ~0.7 s later


def test_an_acl_user_without_channels_still_shares(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    r = redis_server.client()
    r.execute_command("ACL", "SETUSER", "kjit", "on", ">pw", "~kjit:*", "resetchannels", "+@all")
    monkeypatch.setenv(remote.ENV_URL, f"redis://kjit:pw@127.0.0.1:{redis_server.port}/0")
    node(monkeypatch, tmp_path, "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the refused PUBLISH is no fault
        lookup("acl")
    node(monkeypatch, tmp_path, "b")
    assert lookup("acl").cache_hit is True
    watch = tier().backend.watch("0" * 64)  # cannot subscribe: polls instead
    t0 = time.monotonic()
    assert watch.wait(0.05) is False and time.monotonic() - t0 < 0.5
