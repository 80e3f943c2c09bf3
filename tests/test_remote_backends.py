"""A shared tier kjit does not ship, plugged in without editing kjit: tests/dir_tier.py, named
by KJIT_REMOTE_CACHE_BACKEND=module:Class or by an installed package's URL scheme, gets what
the Redis tier gets through kjit.cache.shared: a compile on one node is a hit on another,
values are signed and checked, one node compiles while the others wait on its lease, and a
broken backend is a counted miss. A backend kjit cannot use is a SettingError naming the
variable, before anything compiles."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner

import kjit.cache
from kjit.cache import CacheWarning, backend, registry, remote, shared
from kjit.cache.key import key_hash
from kjit.errors import InvalidOptionError
from kjit.objectcode import ObjectCode
from cache_nodes import lookup_in, node, ptx

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
NS = "backend-test"


def lookup(tag: str, created: list | None = None) -> ObjectCode:
    return lookup_in(NS, tag, created)


DIR_TIER = "dir_tier:DirectoryTier"


@pytest.fixture
def dir_env(tmp_path, monkeypatch):
    """The shared tier in tmp_path/tier, through the test backend, trusted unsigned."""
    for name in remote.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(remote.ENV_URL, f"dir://{tmp_path / 'tier'}")
    monkeypatch.setenv(remote.ENV_BACKEND, DIR_TIER)
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    monkeypatch.setenv(remote.ENV_TIMEOUT, "1s")
    monkeypatch.setenv(remote.ENV_BACKOFF, "1s")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    yield tmp_path / "tier"
    if shared._active is not None:
        shared._active.close()
    shared._pending.clear()  # this process's unsaved counts: not for the next test's cache


def value_file(root: Path, tag: str) -> Path:
    return root / quote(remote.DEFAULT_PREFIX, safe="") / "e" / key_hash(NS, {"tag": tag})


# --- the same behaviours as the Redis tier -----------------------------------------------------
NODE = r'''
import hashlib, json, sys
import kjit, kjit.cache
events = []
kjit.cache.add_listener(lambda e: events.append(e.event))
obj = kjit.compile(sys.argv[1], arch="sm_90")
print(json.dumps({"events": events, "redis": "redis" in sys.modules,
                  "sha": hashlib.sha256(obj.code).hexdigest()}))
'''


def test_a_compile_on_node_a_is_a_hit_on_node_b(dir_env, tmp_path, saxpy_src):
    src = saxpy_src + "\n// two nodes, a plugged-in tier\n"
    out = []
    for name in ("node-a", "node-b"):
        proc = subprocess.run([sys.executable, "-c", NODE, src], capture_output=True, text=True,
                              env=dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / name)), timeout=120)
        assert proc.returncode == 0, proc.stderr
        out.append(json.loads(proc.stdout.splitlines()[-1]))
    assert out[0]["events"] == ["miss"] and out[1]["events"] == ["remote_hit"]
    assert out[0]["sha"] == out[1]["sha"]
    assert not out[0]["redis"] and not out[1]["redis"], "a plugged-in tier loaded redis-py"


@pytest.mark.parametrize("writer_key", [None, "another secret"])
def test_values_are_signed_and_checked(dir_env, tmp_path, monkeypatch, writer_key):
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    node(monkeypatch, tmp_path, "a")
    lookup("signed")
    assert value_file(dir_env, "signed").read_bytes().startswith(b"KJITSIG1")
    node(monkeypatch, tmp_path, "b")
    created: list = []
    assert lookup("signed", created).cache_hit is True and created == []
    # a node without the key (or with another) writes a value the cluster's nodes refuse
    if writer_key:
        monkeypatch.setenv(remote.ENV_KEY, writer_key)
    else:
        monkeypatch.delenv(remote.ENV_KEY)
    node(monkeypatch, tmp_path, "c")
    lookup("forged")
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    node(monkeypatch, tmp_path, "d")
    with pytest.warns(CacheWarning, match="refused"):
        assert lookup("forged", created).cache_hit is False
    assert created == ["forged"] and shared.active().counts["refused"] == 1
    node(monkeypatch, tmp_path, "e")  # d's compile replaced it with a properly signed value
    assert lookup("forged", created).cache_hit is True and created == ["forged"]


def test_a_damaged_value_is_a_counted_miss(dir_env, tmp_path, monkeypatch):
    node(monkeypatch, tmp_path, "a")
    lookup("victim")
    path = value_file(dir_env, "victim")
    data, expires = bytearray(path.read_bytes()), path.stat().st_mtime
    data[-20] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, (expires, expires))  # the file's mtime is its expiry: keep it live
    node(monkeypatch, tmp_path, "b")
    created: list = []
    with pytest.warns(CacheWarning, match="corrupt"):
        assert lookup("victim", created).cache_hit is False
    assert created == ["victim"] and shared.active().counts["corrupt"] == 1


NODE_SLOW = r'''
import json, os, sys, time
import kjit.cache
from kjit.objectcode import ObjectCode
log, start = sys.argv[1], float(sys.argv[2])
def create():
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    return ObjectCode(b".version 9.0\n.target sm_90\n.address_size 64\n", kind="ptx")
while time.time() < start:
    time.sleep(0.001)
print(json.dumps({"hit": kjit.cache.get_or_create("lease-test", {"k": 1}, create).cache_hit}))
'''


def test_nodes_starting_together_compile_once(dir_env, tmp_path):
    """The lease is atomic across processes: of 4 nodes starting one key at the same instant,
    one creates it and the others wait for its value."""
    log, start = tmp_path / "creates.log", time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", NODE_SLOW, str(log), str(start)],
                              env=dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / f"node{i}")),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    hits = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        hits.append(json.loads(out)["hit"])
    assert len(log.read_text().splitlines()) == 1, "more than one node created the value"
    assert sorted(hits) == [False, True, True, True]


def test_a_waiter_gets_the_holders_value_and_a_dead_holders_lease_lapses(dir_env, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.ENV_LEASE, "1s")
    tier = shared.active().backend
    k = key_hash(NS, {"tag": "waited"})
    held = tier.lease(k, 30)
    assert held is not None and tier.lease(k, 30) is None  # one holder at a time
    assert 0 < tier.lease_ttl(k) <= 30
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(lookup("waited")))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive(), "the waiter did not wait for the lease holder"
    from kjit.cache import entry
    tier.put(k, entry.encode(k, ptx("waited"), {}), 60)
    waiter.join(10)
    held.release()
    assert got[0].cache_hit is True and b".entry waited()" in got[0].code
    # a holder that dies never renews: its lease lapses after KJIT_REMOTE_CACHE_LEASE
    k = key_hash(NS, {"tag": "orphan"})
    assert tier.lease(k, 1.0) is not None
    node(monkeypatch, tmp_path, "b")
    t0, created = time.monotonic(), []
    assert lookup("orphan", created).cache_hit is False and created == ["orphan"]
    assert 0.7 < time.monotonic() - t0 < 5


@pytest.mark.parametrize("cls", ["DirectoryTier", "ClientErrorTier"])
def test_a_broken_backend_is_a_counted_miss(dir_env, tmp_path, monkeypatch, cls):
    """A store that cannot be reached (here: a directory below a file), or a client library
    raising its own errors, costs one warning and a back-off; the compile goes on."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(remote.ENV_URL, f"dir://{tmp_path / 'a-file' / 'tier'}")
    monkeypatch.setenv(remote.ENV_BACKEND, f"dir_tier:{cls}")
    created: list = []
    with pytest.warns(CacheWarning, match="cannot be used"):
        assert lookup("down", created).cache_hit is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # one warning, then skipped during the back-off
        assert lookup("down-2", created).cache_hit is False
    assert created == ["down", "down-2"]
    counts = shared.active().counts
    assert counts["errors"] == 1 and counts["skipped"] >= 1
    assert lookup("down", created).cache_hit is True  # the local disk still has it


def test_the_cache_commands_work_through_the_interface(dir_env, tmp_path, monkeypatch):
    node(monkeypatch, tmp_path, "a")
    lookup("listed")
    assert [r["label"] for r in kjit.cache.ls_remote()] == ["listed"]
    stats = kjit.cache.stats_remote()
    assert stats["entries"] == 1 and stats["bytes"] > 0 and "directory" in stats["server"]["server"]
    res = CliRunner().invoke(_cli(), ["cache", "stats", "--remote"])
    assert res.exit_code == 0 and re.search(r"server +directory .*\(values 1\)", res.output), res.output
    assert kjit.cache.clear_remote() == 1 and kjit.cache.ls_remote() == []


def _cli():
    from kjit.cli.main import cli
    return cli


# --- choosing a backend ------------------------------------------------------------------------
@pytest.mark.parametrize("spec, var, words", [
    ("no_such_module_for_kjit:Tier", remote.ENV_BACKEND, "cannot be imported"),
    ("dir_tier:NoSuchClass", remote.ENV_BACKEND, "has no NoSuchClass"),
    ("dir_tier", remote.ENV_BACKEND, "package.module:Class"),
    ("dir_tier:NEVER", remote.ENV_BACKEND, "not a class"),
    ("dir_tier:NotATier", remote.ENV_BACKEND, "not a kjit.cache.backend.RemoteTier subclass: "
                                              "subclass it"),
    ("dir_tier:HalfTier", remote.ENV_BACKEND, "does not implement clear, delete, keys, lease, "
                                              "peek, sizes, stats"),
])
def test_a_backend_kjit_cannot_use_is_named_before_any_compile(dir_env, monkeypatch, spec, var, words):
    monkeypatch.setenv(remote.ENV_BACKEND, spec)
    created: list = []
    with pytest.raises(InvalidOptionError, match=var) as info:
        lookup("never", created)
    assert words in str(info.value) and created == []
    res = CliRunner().invoke(_cli(), ["cache", "stats", "--remote", "--json"])
    assert res.exit_code == 2 and var in res.output, res.output
    with pytest.raises(InvalidOptionError, match=var):  # configure() checks the class at once
        kjit.cache.configure_remote(os.environ[remote.ENV_URL], backend=spec, unsigned=True)
    assert os.environ[remote.ENV_BACKEND] == spec, "a refused configure() changed the settings"


def test_a_class_that_is_not_a_tier_is_told_what_it_lacks(dir_env, monkeypatch):
    monkeypatch.setenv(remote.ENV_BACKEND, "dir_tier:NotATier")
    with pytest.raises(InvalidOptionError, match="it also lacks clear, delete, keys, lease, peek, sizes, stats"):
        lookup("never")


def test_a_url_the_backend_refuses_names_the_url(dir_env, monkeypatch):
    monkeypatch.setenv(remote.ENV_URL, "dir://relative/path")
    with pytest.raises(InvalidOptionError, match=f"{remote.ENV_URL}=.*cannot be used by {DIR_TIER}.*absolute"):
        lookup("never")


def test_an_unknown_scheme_says_how_to_add_one(monkeypatch):
    for name in remote.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(remote.ENV_URL, "s3://bucket/kjit")
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    with pytest.raises(InvalidOptionError, match=remote.ENV_URL) as info:
        lookup("never")
    for words in ("redis://", "rediss://", "unix://", remote.ENV_BACKEND, registry.GROUP, "Writing your own tier"):
        assert words in str(info.value)


def test_redis_urls_still_choose_redis_and_a_named_class_takes_any_url():
    for url in ("redis://h:6379/0", "REDISS://h:6380/0", "unix:///run/redis.sock"):
        assert remote.RemoteConfig.from_env({remote.ENV_URL: url}).backend.spec == registry.REDIS
    cfg = remote.RemoteConfig.from_env({remote.ENV_URL: "s3://bucket", remote.ENV_BACKEND: "pkg.mod:S3Tier"})
    assert cfg.backend.spec == "pkg.mod:S3Tier" and not cfg.backend.builtin


def test_an_installed_package_serves_its_scheme(dir_env, tmp_path, monkeypatch):
    """An entry point in the group kjit.remote_backends (a package's pyproject:
    [project.entry-points."kjit.remote_backends"] dirtier = "dir_tier:DirectoryTier")."""
    dist = tmp_path / "site" / "kjit_dir_tier-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kjit-dir-tier\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.GROUP}]\ndirtier = {DIR_TIER}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry.entry_points.cache_clear()
    try:
        monkeypatch.delenv(remote.ENV_BACKEND)
        monkeypatch.setenv(remote.ENV_URL, f"dirtier://{tmp_path / 'tier'}")
        node(monkeypatch, tmp_path, "a")
        assert lookup("by-scheme").cache_hit is False
        node(monkeypatch, tmp_path, "b")
        assert lookup("by-scheme").cache_hit is True
        monkeypatch.setenv(remote.ENV_URL, "s3://bucket")
        with pytest.raises(InvalidOptionError, match="installed backend \\(dirtier://\\)"):
            lookup("never")
    finally:
        registry.entry_points.cache_clear()


# --- the interface is the one kjit uses ---------------------------------------------------------
def test_the_interface_declares_every_method_kjit_calls_on_a_backend():
    used = {m for p in Path(kjit.__file__).parent.rglob("*.py")   # the checkout's, or the wheel's
            for m in re.findall(r"\bbackend\.(\w+)\(", p.read_text())}
    assert used and used <= set(dir(backend.RemoteTier)), used - set(dir(backend.RemoteTier))
    assert backend.RemoteTier.__abstractmethods__ == {
        "get", "put", "lease", "keys", "peek", "sizes", "delete", "clear", "stats"}
    # the guard around a plug-in passes every call on, defaults included
    public = {m for m in dir(backend.RemoteTier) if not m.startswith("_") and m != "from_config"
              and callable(getattr(backend.RemoteTier, m))}
    assert public <= set(vars(registry.Guarded)), public - set(vars(registry.Guarded))


class _NoCredentials(__import__("dir_tier").DirectoryTier):
    """A plug-in whose client finds no credentials when it is made."""

    @classmethod
    def from_config(cls, config):
        raise RuntimeError("no credentials found")


def test_a_plugin_failing_to_start_is_a_setting_error_naming_it(monkeypatch):
    spec = f"{_NoCredentials.__module__}:_NoCredentials"
    monkeypatch.setenv("KJIT_REMOTE_CACHE", "s3://bucket/prefix")
    monkeypatch.setenv("KJIT_REMOTE_CACHE_BACKEND", spec)
    from kjit.settings import SettingError
    from kjit.cache import registry, remote
    choice = registry.choose("s3://bucket/prefix", spec)
    with pytest.raises(SettingError, match=r"from_config failed \(RuntimeError: no credentials found\)"):
        registry.open_backend(choice, remote.RemoteConfig.from_env())
