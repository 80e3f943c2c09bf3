"""The store: bytes + JSON entries, checksums, corruption, read-only/full disks, eviction,
the memory layer, listeners, metadata, export/import, prune, verify."""
from __future__ import annotations

import os
import sqlite3
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kjit
import kjit.cache as cache
from kjit.cache import entry, lookup
from kjit.cache.disk import CacheWarning, DiskStore
from kjit.objectcode import ObjectCode

PTX = b".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k%d()\n{\nret;\n}\n"


def ptx(i: int = 0, pad: int = 0) -> ObjectCode:
    return ObjectCode(PTX.replace(b"%d", str(i).encode()) + b"// " + b"x" * pad + b"\n", kind="ptx",
                      log=f"log {i}", symbols={f"k<{i}>": f"k{i}"}, name=f"k{i}.cu",
                      metadata={"compiler": "test", "options": {"i": i}})


class Maker:
    """create() that counts its calls."""

    def __init__(self, i=0, pad=0):
        self.i, self.pad, self.calls = i, pad, 0

    def __call__(self):
        self.calls += 1
        return ptx(self.i, self.pad)


def get(i=0, pad=0, maker=None, **kw):
    maker = maker or Maker(i, pad)
    return cache.get_or_create("test", {"i": i, "pad": pad}, maker, **kw), maker


def drop_memory():
    """What a fresh process sees: no memory layer."""
    lookup.current().memory.clear()


def disk() -> DiskStore:
    return lookup.current().disk


def only_key() -> str:
    (k,) = disk().keys()
    return k


# --- basic contract ------------------------------------------------------------------------------
def test_miss_then_memory_hit_then_disk_hit():
    a, m = get(1)
    b, _ = get(1, maker=m)
    drop_memory()
    c, _ = get(1, maker=m)
    assert (a.cache_hit, b.cache_hit, c.cache_hit, m.calls) == (False, True, True, 1)
    assert a == b == c and c.log == "log 1" and dict(c.symbols) == {"k<1>": "k1"}


def test_disabled_by_argument_and_env(monkeypatch):
    a, m = get(2, enabled=False)
    assert a.cache_hit is None and disk().keys() == []
    monkeypatch.setenv("KJIT_CACHE", "0")
    b, _ = get(2, maker=m)
    c = kjit.compile("extern \"C\" __global__ void k(){}", arch="sm_90")
    assert b.cache_hit is None and c.cache_hit is None and m.calls == 2
    assert not any(lookup.current().path.glob("entries/*.db")) or disk().keys() == []


def test_compile_cache_false():
    src = 'extern "C" __global__ void k(){}'
    assert kjit.compile(src, arch="sm_90", cache=False).cache_hit is None
    assert kjit.compile(src, arch="sm_90").cache_hit is False
    assert kjit.compile(src, arch="sm_90", cache=False).cache_hit is None


def test_directory_is_private():
    get(3)
    assert stat.S_IMODE(os.stat(cache.path()).st_mode) == 0o700


def test_values_are_bytes_never_pickle():
    get(4)
    get(5, pad=40000)  # large: stored in a file, not in SQLite
    con = sqlite3.connect(cache.path() / "entries" / "cache.db")
    modes = {row[0] for row in con.execute("SELECT mode FROM Cache")}
    raws = {row[0] for row in con.execute("SELECT raw FROM Cache")}
    assert modes <= {1, 2} and raws == {1}  # MODE_RAW / MODE_BINARY; raw string keys
    con = sqlite3.connect(cache.path() / "usage" / "cache.db")
    assert {row[0] for row in con.execute("SELECT mode FROM Cache")} <= {1, 2, 3}


def test_digest_covers_kind_arch_and_code():
    a, b = ptx(1), ptx(2)
    assert cache.digest(a) == cache.digest(ptx(1)) != cache.digest(b)
    assert cache.digest(a) != cache.digest(a.with_(arch="compute_80"))
    assert len(cache.digest(a)) == 64


def test_key_must_be_json():
    with pytest.raises(kjit.InvalidOptionError, match="JSON"):
        cache.get_or_create("test", {"x": object()}, Maker())


# --- corruption of each part ----------------------------------------------------------------------
def _mutations(blob: bytes) -> dict[str, bytes]:
    p = entry._PREFIX.size
    hlen = struct.unpack_from("<I", blob, 8)[0]
    flip = lambda b, i: b[:i] + bytes([b[i] ^ 0xFF]) + b[i + 1:]  # noqa: E731
    return {
        "magic": flip(blob, 0),
        "header-length": flip(blob, 8),
        "code-length": flip(blob, 12),
        "checksum": flip(blob, 20),
        "header": flip(blob, p + 2),
        "code": flip(blob, p + hlen + 3),
        "truncated": blob[:-7],
        "extended": blob + b"\0",
        "empty": b"",
        "text-instead-of-bytes": "not bytes",
    }


@pytest.mark.parametrize("part", list(_mutations(entry.encode("k" * 64, ptx(), {})).keys()))
@pytest.mark.parametrize("pad", [0, 40000], ids=["in-sqlite", "in-file"])
def test_corrupt_part_is_dropped_rebuilt_and_warned_once(part, pad):
    a, m = get(6, pad)
    k = only_key()
    bad = _mutations(disk().get_blob(k))[part]
    disk().entries.set(k, bad)
    drop_memory()
    events = []
    cache.add_listener(events.append)
    try:
        with pytest.warns(CacheWarning, match="corrupt") as rec:
            b, _ = get(6, pad, maker=m)
    finally:
        cache.remove_listener(events.append)
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1
    assert b.cache_hit is False and b == a and m.calls == 2
    assert [e.event for e in events] == ["corrupt", "miss"]
    drop_memory()
    assert get(6, pad, maker=m)[0].cache_hit is True  # the rebuilt entry is good


def test_truncated_value_file_on_disk():
    a, m = get(7, 40000)
    (f,) = [p for p in (cache.path() / "entries").rglob("*.val")]
    f.write_bytes(f.read_bytes()[:1000])
    drop_memory()
    with pytest.warns(CacheWarning, match="truncated"):
        b, _ = get(7, 40000, maker=m)
    assert b.cache_hit is False and b == a


def test_deleted_value_file_is_a_miss():
    a, m = get(8, 40000)
    for f in (cache.path() / "entries").rglob("*.val"):
        f.unlink()
    drop_memory()
    assert get(8, 40000, maker=m)[0].cache_hit is False


def test_pickled_row_is_never_unpickled(tmp_path):
    """A poisoned database row (pickle mode) costs a recompile, never runs code."""
    import pickle
    a, m = get(9)
    k = only_key()
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Boom(str(marker)))
    disk().close()
    con = sqlite3.connect(cache.path() / "entries" / "cache.db")
    con.execute("UPDATE Cache SET mode=4, value=? WHERE key=?", (payload, k))
    con.commit()
    con.close()
    drop_memory()
    with pytest.warns(CacheWarning, match="pickled"):
        b, _ = get(9, maker=m)
    assert not marker.exists() and b.cache_hit is False and b == a


class _Boom:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_entry_under_the_wrong_key_is_rejected():
    get(10)
    get(11)
    k10, k11 = sorted(disk().keys(), key=lambda k: disk().meta(k)["label"])
    disk().entries.set(k11, disk().get_blob(k10))  # someone swapped values
    drop_memory()
    with pytest.warns(CacheWarning, match="belongs to key"):
        b, _ = get(11)
    assert b.cache_hit is False and b.entry_points == ("k11",)


# --- degraded disks -------------------------------------------------------------------------------
def test_unusable_dir_degrades_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(CacheWarning, match="cannot be used") as rec:
        a, m = get(12)
        b, _ = get(13)
        c, _ = get(12, maker=m)
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1
    assert (a.cache_hit, b.cache_hit, c.cache_hit, m.calls) == (False, False, True, 1)


def test_full_disk_degrades_with_one_warning(monkeypatch):
    import diskcache

    def full(self, *a, **k):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(diskcache.Cache, "set", full)
    with pytest.warns(CacheWarning, match="disk is full") as rec:
        a, m = get(14)
        b, _ = get(15)
        c, _ = get(14, maker=m)
    assert (a.cache_hit, b.cache_hit, c.cache_hit, m.calls) == (False, False, True, 1)
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1


READONLY_SCRIPT = r'''
import warnings, kjit
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    src = 'extern "C" __global__ void k(float* y){ y[0] = 1; }'
    a = kjit.compile(src, arch="sm_90")
    b = kjit.compile(src, arch="sm_90")
    c = kjit.compile(src + " ", arch="sm_90")
msgs = [str(x.message) for x in w if x.category.__name__ == "CacheWarning"]
print(*msgs, file=__import__("sys").stderr)
print(a.cache_hit, b.cache_hit, c.cache_hit, len(msgs), len(a.code) > 0)
'''


def _run_readonly(cache: Path, tmp_path: Path, cache_env: str | None = None,
                  script: str = READONLY_SCRIPT) -> subprocess.CompletedProcess:
    """Run `script` with `cache` not writable: chmod for a normal user; for root
    (who ignores permissions) a read-only bind mount in a private mount namespace."""
    env = dict(os.environ, KJIT_CACHE_DIR=cache_env or str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(kjit.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-c", script]
    if os.geteuid() == 0:
        import shlex
        import shutil
        if not shutil.which("unshare"):
            pytest.skip("running as root without unshare: cannot make a read-only directory")
        inner = (f"mount --bind {shlex.quote(str(cache))} {shlex.quote(str(cache))} && "
                 f"mount -o remount,ro,bind {shlex.quote(str(cache))} && exec " + shlex.join(cmd))
        cmd = ["unshare", "-m", "sh", "-c", inner]
    else:
        cache.chmod(0o555)
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        cache.chmod(0o700)


def test_read_only_empty_cache_dir(tmp_path):
    """A directory the user cannot write: compiles still work, one warning, no crash."""
    ro = tmp_path / "ro"
    ro.mkdir()
    out = _run_readonly(ro, tmp_path)
    if "unshare failed" in out.stderr or "mount:" in out.stderr:
        pytest.skip(f"cannot make a read-only mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False", "1", "True"]
    assert list(ro.iterdir()) == []


def test_read_only_populated_cache_dir(tmp_path, monkeypatch):
    """A cache made read-only after it was filled (e.g. a shared prebuilt cache)."""
    ro = tmp_path / "ro"
    monkeypatch.setenv("KJIT_CACHE_DIR", str(ro))
    kjit.compile('extern "C" __global__ void k(float* y){ y[0] = 1; }', arch="sm_90")
    lookup.current().disk.close()
    out = _run_readonly(ro, tmp_path)
    if "unshare failed" in out.stderr or "mount:" in out.stderr:
        pytest.skip(f"cannot make a read-only mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    # served from the read-only cache; the new result kept in memory, with one warning
    assert out.stdout.split() == ["True", "True", "False", "1", "True"], out.stderr
    assert "read-only" in out.stderr and "kept in memory" in out.stderr


OVERLAY_SCRIPT = r'''
import warnings, kjit
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    src = 'extern "C" __global__ void k(float* y){ y[0] = 1; }'
    a = kjit.compile(src, arch="sm_90")
    c = kjit.compile(src + " ", arch="sm_90")
    print(a.cache_hit, c.cache_hit, len([x for x in w if x.category.__name__ == "CacheWarning"]))
'''


def test_read_only_cache_with_a_writable_overlay(tmp_path, monkeypatch):
    """KJIT_CACHE_DIR=baked:overlay: hits from the read-only one, new results in the other."""
    ro, overlay = tmp_path / "ro", tmp_path / "overlay"
    src = 'extern "C" __global__ void k(float* y){ y[0] = 1; }'
    monkeypatch.setenv("KJIT_CACHE_DIR", str(ro))
    kjit.compile(src, arch="sm_90")
    lookup.current().disk.close()
    out = _run_readonly(ro, tmp_path, cache_env=f"{ro}{os.pathsep}{overlay}", script=OVERLAY_SCRIPT)
    if "unshare failed" in out.stderr or "mount:" in out.stderr:
        pytest.skip(f"cannot make a read-only mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "0"], out.stderr
    monkeypatch.setenv("KJIT_CACHE_DIR", str(overlay))
    assert kjit.compile(src + " ", arch="sm_90").cache_hit is True   # kept in the overlay
    assert len(cache.ls()) == 1


# --- eviction --------------------------------------------------------------------------------------
def test_lru_eviction_at_the_size_limit(monkeypatch):
    monkeypatch.setenv("KJIT_CACHE_SIZE", "300K")
    makers = {}
    for i in range(4):
        makers[i] = get(20 + i, 60000)[1]
    get(20, 60000, maker=makers[0])                # memory hit: counts as a use
    drop_memory()
    get(20, 60000, maker=makers[0])                # disk hit refreshes LRU order
    for i in range(4, 10):
        makers[i] = get(20 + i, 60000)[1]
        time.sleep(0.01)
    st = cache.stats()
    assert st["disk_bytes"] <= 300 * 1024 + 64 * 1024  # diskcache culls after the write
    labels = {disk().meta(k)["label"] for k in disk().keys()}
    assert "k29.cu" in labels and "k21.cu" not in labels  # newest kept, least recent evicted
    drop_memory()
    a, _ = get(21, 60000, maker=makers[1])
    assert a.cache_hit is False and makers[1].calls == 2  # evicted entries rebuild


def test_size_env_must_be_a_size(monkeypatch):
    monkeypatch.setenv("KJIT_CACHE_SIZE", "lots")
    with pytest.raises(kjit.InvalidOptionError, match="KJIT_CACHE_SIZE"):
        get(30)


def test_memory_layer_is_bounded(monkeypatch):
    from kjit.cache.lookup import MemoryLayer
    mem = MemoryLayer(limit=1000)
    for i in range(10):
        mem.put(str(i), ptx(i, 300))
    assert len(mem) == 2 and mem.get("9") is not None and mem.get("0") is None


def test_memory_layer_counts_a_key_once_when_threads_store_it_together():
    """Threads that hit one key at once each put it in the memory layer: its byte count must
    stay that of one copy (a drifting count ends in popitem() on an empty layer)."""
    import threading
    import time
    from collections import OrderedDict
    from kjit.cache.lookup import MemoryLayer

    class SlowPop(OrderedDict):   # widens the window between a put's pop and its insert
        def pop(self, *a):
            found = super().pop(*a)
            time.sleep(0.002)
            return found

    mem = MemoryLayer(limit=10_000)
    mem._items = SlowPop()
    obj = ptx(1, 300)
    threads = [threading.Thread(target=mem.put, args=("k", obj)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(mem) == 1 and mem._bytes == len(obj.code)


# --- metadata, listeners ----------------------------------------------------------------------------
def test_entry_metadata(monkeypatch, saxpy_src):
    monkeypatch.setenv("KJIT_CACHE_SAVE_SOURCE", "1")
    obj = kjit.compile(saxpy_src, arch="sm_90", options=kjit.CompileOptions(fast_math=True))
    kjit.compile(saxpy_src, arch="sm_90", options=kjit.CompileOptions(fast_math=True))
    lookup.current().flush_hits()
    (row,) = cache.ls()
    for field in ("kernels", "kind", "arch", "size", "create_ms", "created", "last_used", "hits",
                  "compiler", "options", "name", "source_sha256"):
        assert field in row, field
    assert row["kernels"] == ["saxpy"] and row["kind"] == "cubin" and row["arch"] == "sm_90"
    assert row["size"] == len(obj.code) and row["hits"] == 1 and row["options"]["fast_math"] is True
    assert row["compiler"].startswith("nvrtc") and row["create_ms"] > 0
    assert cache.show(row["key"][:8])["source"] == saxpy_src


def test_source_not_saved_by_default(saxpy_src):
    kjit.compile(saxpy_src, arch="sm_90")
    (row,) = cache.ls()
    info = cache.show(row["key"])
    assert info["source"] is None and info["source_sha256"]


def test_listener_reports_hits_misses_and_times():
    events = []
    fn = cache.add_listener(events.append)
    try:
        get(40)
        get(40)
        drop_memory()
        get(40)
        get(41, enabled=False)
    finally:
        cache.remove_listener(fn)
    assert [e.event for e in events] == ["miss", "memory_hit", "disk_hit", "bypass"]
    miss, mem, dsk, _ = events
    assert miss.create_s > 0 and miss.lookup_s >= miss.create_s and miss.size == len(ptx(40).code)
    assert 0 < mem.lookup_s < dsk.lookup_s and mem.namespace == "test" and len(mem.key) == 64
    get(40)
    assert len(events) == 4  # removed listeners are not called


def test_broken_listener_does_not_break_a_compile():
    def bad(event):
        raise RuntimeError("listener bug")
    cache.add_listener(bad)
    try:
        with pytest.warns(RuntimeWarning, match="listener bug"):
            assert get(42)[0].cache_hit is False
    finally:
        cache.remove_listener(bad)


def test_stats_count_hits_and_misses():
    get(50)
    get(50)
    get(51)
    drop_memory()
    get(51)
    s = cache.stats()
    assert (s["entries"], s["hits"], s["misses"]) == (2, 2, 2) and s["hit_rate"] == 0.5
    assert s["bytes"] == len(ptx(50).code) + len(ptx(51).code)


# --- maintenance --------------------------------------------------------------------------------------
def test_clear():
    get(60)
    get(61)
    assert cache.clear() == 2 and cache.ls() == []
    assert get(60)[0].cache_hit is False  # memory layer cleared too


def test_prune_older_than_and_max_size():
    for i in range(5):
        get(70 + i, 1000)
    keys = {disk().meta(k)["label"]: k for k in disk().keys()}
    disk().usage.set("used:" + keys["k70.cu"], time.time() - 10 * 86400)
    r = cache.prune(older_than="7d")
    assert r["removed"] == 1 and "k70.cu" not in {m["label"] for m in cache.ls()}
    disk().usage.set("used:" + keys["k71.cu"], time.time() - 3600)  # least recently used
    before = disk().volume()
    r = cache.prune(max_size=before - 1)
    assert r["keys"][0] == keys["k71.cu"] and r["disk_bytes"] < before
    assert len(cache.ls()) == 4 - r["removed"]
    r = cache.prune(max_size=0)
    assert cache.ls() == [] and r["entries_left"] == 0
    with pytest.raises(kjit.InvalidOptionError):
        cache.prune()
    with pytest.raises(kjit.InvalidOptionError, match="duration"):
        cache.prune(older_than="soon")


def test_verify_finds_and_drops_corrupt_entries():
    get(80)
    get(81)
    k = sorted(disk().keys())[0]
    disk().entries.set(k, disk().get_blob(k)[:-1])
    r = cache.verify()
    assert r["checked"] == 2 and r["ok"] == 1 and r["corrupt"][0]["key"] == k
    assert cache.verify() == {"checked": 1, "ok": 1, "corrupt": [], "unreadable": 0}


def test_export_import_round_trip(tmp_path, monkeypatch, saxpy_src):
    a = kjit.compile(saxpy_src, arch="sm_90", name_expressions=())
    get(90)
    r = cache.export(tmp_path / "pack.zip")
    assert r["exported"] == 2
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "other"))  # another machine
    r = cache.import_(tmp_path / "pack.zip")
    assert r["imported"] == 2 and r["rejected"] == []
    b = kjit.compile(saxpy_src, arch="sm_90")
    assert b.cache_hit is True and b.code == a.code
    assert cache.import_(tmp_path / "pack.zip")["already_present"] == 2


def test_import_rejects_corrupt_and_foreign_entries(tmp_path, monkeypatch):
    import zipfile
    get(91)
    cache.export(tmp_path / "pack.zip")
    with zipfile.ZipFile(tmp_path / "pack.zip") as z:
        items = {i.filename: z.read(i) for i in z.infolist()}
    (name,) = [n for n in items if n.startswith("entries/")]
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as z:
        z.writestr("manifest.json", items["manifest.json"])
        z.writestr(name, items[name][:-3] + b"XYZ")
        z.writestr("entries/../../etc/passwd", b"x")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "other"))
    r = cache.import_(tmp_path / "bad.zip")
    assert r["imported"] == 0 and len(r["rejected"]) == 2 and cache.ls() == []
    (tmp_path / "junk.zip").write_bytes(b"junk")
    with pytest.raises(kjit.InvalidOptionError, match="not a kjit cache export"):
        cache.import_(tmp_path / "junk.zip")


def test_cache_dir_default_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "x"))
    assert cache.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("KJIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert cache.cache_dir() == tmp_path / "xdg" / "kjit"


READONLY_OPS_SCRIPT = r'''
import kjit, kjit.cache as c
s = c.stats()
rows = c.ls()
try:
    c.clear()
    cleared = "cleared"
except kjit.KjitError as exc:
    cleared = "refused" if "read-only" in str(exc) else str(exc)
print(s["entries"], s["read_only"], len(rows), c.verify()["ok"], cleared)
'''


def test_cache_commands_on_a_read_only_cache(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    monkeypatch.setenv("KJIT_CACHE_DIR", str(ro))
    kjit.compile('extern "C" __global__ void k(float* y){ y[0] = 1; }', arch="sm_90")
    lookup.current().disk.close()
    out = _run_readonly(ro, tmp_path, script=READONLY_OPS_SCRIPT)
    if "unshare failed" in out.stderr or "mount:" in out.stderr:
        pytest.skip(f"cannot make a read-only mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "True", "1", "1", "refused"], out.stderr


# --- local settings: a bad value is one clear error, on a hit and on a miss ----------------------
from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402

from kjit.settings import SettingError, check_settings, parse_duration, parse_size  # noqa: E402

SETTING_SRC = 'extern "C" __global__ void k(float* y){ y[0] = 1; }'


@pytest.mark.parametrize("name, value", [
    ("KJIT_CACHE_SIZE", "abc"), ("KJIT_CACHE_SIZE", "-1G"), ("KJIT_CACHE_SIZE", "9" * 400),
    ("KJIT_CACHE_MEMORY_SIZE", "lots"), ("KJIT_CACHE", "disable"),
    ("KJIT_CACHE_SAVE_SOURCE", "please"), ("KJIT_HEADER_WATCH", "2"),
])
def test_a_bad_setting_fails_the_hit_and_the_miss_alike(monkeypatch, name, value):
    kjit.compile(SETTING_SRC, arch="sm_90")        # in the cache, with good settings
    monkeypatch.setattr(lookup, "_caches", {})      # as a fresh process sees it
    monkeypatch.setenv(name, value)
    for src in (SETTING_SRC, SETTING_SRC + "\n// a miss"):
        with pytest.raises(SettingError) as info:
            kjit.compile(src, arch="sm_90")
        assert f"{name}={value!r}" in str(info.value)
        monkeypatch.setattr(lookup, "_caches", {})


@pytest.mark.parametrize("name, value", [
    ("KJIT_CACHE_SIZE", " 2G "), ("KJIT_CACHE_SIZE", "512MiB"), ("KJIT_CACHE_MEMORY_SIZE", "0"),
    ("KJIT_CACHE_SAVE_SOURCE", "TRUE"), ("KJIT_HEADER_WATCH", "Off"), ("KJIT_CACHE_SIZE", ""),
])
def test_good_settings_are_accepted(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    check_settings()
    assert kjit.compile(SETTING_SRC, arch="sm_90").code


def test_save_source_switch_ignores_case(monkeypatch):
    monkeypatch.setenv("KJIT_CACHE_SAVE_SOURCE", "TRUE")
    kjit.compile(SETTING_SRC, arch="sm_90")
    assert cache.show(cache.ls()[0]["key"])["source"] == SETTING_SRC


def test_a_cache_dir_that_is_a_file_says_so(tmp_path, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(f))
    with pytest.warns(CacheWarning, match="is not a directory"):
        assert kjit.compile(SETTING_SRC, arch="sm_90").code
    with pytest.raises(kjit.KjitError, match="is not a directory"):
        cache.ls()


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40),
                 st.from_regex(r"\s*\d{1,400}(\.\d{0,30})?\s*[kKmMgGtTiIbB]{0,3}\s*", fullmatch=True)))
def test_parse_size_gives_a_size_or_a_clear_value_error(text):
    try:
        n = parse_size(text)
    except ValueError as exc:
        assert "size" in str(exc)
    else:
        assert isinstance(n, int) and 0 <= n <= 1 << 62


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=40),
                 st.from_regex(r"\s*\d{1,400}(\.\d{0,30})?\s*(ms|[smhdwSMHDW])?\s*", fullmatch=True)))
def test_parse_duration_gives_a_finite_duration_or_a_clear_value_error(text):
    try:
        s = parse_duration(text)
    except ValueError as exc:
        assert "duration" in str(exc)
    else:
        assert 0 <= s < float("inf")


@hsettings(max_examples=200, deadline=None)
@given(st.sampled_from(["KJIT_CACHE_SIZE", "KJIT_CACHE_MEMORY_SIZE", "KJIT_CACHE",
                        "KJIT_CACHE_SAVE_SOURCE", "KJIT_HEADER_WATCH"]),
       st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
               max_size=30))
def test_check_settings_accepts_or_names_the_variable(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        check_settings()
    except SettingError as exc:
        assert str(exc).startswith(f"{name}=")
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=20), st.from_regex(r"(sm|compute|gfx)_?\d{0,40}[a-z]{0,3}", fullmatch=True)),
       st.sampled_from(["cuda", "hip"]))
def test_an_arch_name_parses_or_says_what_is_accepted(text, backend):
    """KJIT_ARCH and --arch: a target or InvalidOptionError, nothing else."""
    from kjit import arch as arch_mod
    try:
        a = arch_mod.parse(text, backend)
    except kjit.InvalidOptionError as exc:
        assert str(exc)
    else:
        assert a.backend == backend and a.name
