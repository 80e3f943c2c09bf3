"""A damaged or hostile cache directory (issue 16, defects 1 and 7): rows another program
wrote, a corrupt database, planted links, a directory others can write. Every `kjit cache`
command skips and counts what it cannot read, `verify` removes it, `clear` always works and
never follows a link out of the directory, and nothing is ever unpickled."""
from __future__ import annotations

import json
import os
import sqlite3
import stat
import warnings

import diskcache
import pytest
from click.testing import CliRunner

import kjit
import kjit.cache as cache
from kjit.cache import lookup
from kjit.cache.disk import CacheWarning
from kjit.cli.main import cli
from kjit.objectcode import ObjectCode

PTX = b".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k%d()\n{\nret;\n}\n"


def make(i: int):
    return lambda: ObjectCode(PTX.replace(b"%d", str(i).encode()), kind="ptx", name=f"k{i}.cu")


def get(i: int):
    return cache.get_or_create("test", {"i": i}, make(i))


def run(*args: str, code: int = 0):
    res = CliRunner().invoke(cli, ["cache", *args])
    assert res.exit_code == code, (res.output, res.exception)
    assert "Traceback" not in res.output
    return res


def jrun(*args: str, code: int = 0):
    return json.loads(run(*args, "--json", code=code).stdout)


class _Boom:
    """Unpickling this would create a file: the tests check it never appears."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant_foreign_rows(tmp_path) -> str:
    """Rows a plain diskcache (which pickles) writes into both databases: a pickled key,
    pickled values under string keys, a pickled metadata row for a real entry."""
    get(1)
    get(2)
    real = sorted(lookup.current().disk.keys())[0]
    lookup.current().disk.close()
    marker = str(tmp_path / "unpickled")
    with diskcache.Cache(str(cache.path() / "entries")) as c:
        c.set(("a", "tuple", "key"), b"x")
        c.set("f" * 64, _Boom(marker))
    with diskcache.Cache(str(cache.path() / "usage")) as u:
        u.set(("pickled",), 1)
        u.set("meta:" + real, {"label": _Boom(marker)})
        u.set("hits:" + real, [1, 2])
    return marker


def test_every_command_skips_and_counts_rows_it_cannot_read(tmp_path):
    marker = plant_foreign_rows(tmp_path)
    rows = jrun("ls")
    assert len(rows) == 2 and {r["label"] for r in rows} == {"k1.cu", "k2.cu"}  # metadata from the entry
    assert all(r["key"][:16] in run("ls").stdout for r in rows)
    s = jrun("stats")
    assert s["entries"] == 2 and s["unreadable"] == 5
    assert "unreadable 5 rows" in run("stats").stdout
    key = rows[0]["key"]
    assert jrun("show", key[:12])["key"] == key
    assert jrun("export", str(tmp_path / "x.zip"))["exported"] == 2
    assert jrun("prune", "--older-than", "30d")["removed"] == 0
    v = jrun("verify", code=1)             # found something: exit 1, with the report
    assert v["ok"] == 2 and v["unreadable"] == 5 and v["corrupt"] == []
    assert jrun("verify") == {"checked": 2, "ok": 2, "corrupt": [], "unreadable": 0}
    assert jrun("stats")["unreadable"] == 0
    assert not os.path.exists(marker)


def test_clear_removes_foreign_rows_too(tmp_path):
    marker = plant_foreign_rows(tmp_path)
    r = jrun("clear", "--yes")
    assert r == {"removed": 2, "unreadable_removed": 5, "reset": False}
    assert jrun("stats")["entries"] == 0 and jrun("stats")["unreadable"] == 0
    assert not os.path.exists(marker)


def test_compiles_go_on_beside_foreign_rows(tmp_path):
    marker = plant_foreign_rows(tmp_path)
    lookup.current().memory.clear()
    assert get(1).cache_hit is True and get(3).cache_hit is False
    lookup.current().flush_hits()   # the pickled hits row cannot be incremented: skipped quietly
    assert not os.path.exists(marker)


@pytest.mark.parametrize("damage", ["header", "middle"])
def test_clear_works_on_a_corrupt_database(damage):
    for i in range(40):
        get(100 + i)
    lookup.current().disk.close()
    db = cache.path() / "entries" / "cache.db"
    data = bytearray(db.read_bytes())
    if damage == "header":
        data[:100] = b"\xa5" * 100
    else:
        data[4096:len(data) - 4096] = b"\xa5" * (len(data) - 8192)
    db.write_bytes(bytes(data))
    lookup._caches.clear()
    res = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["error"]["type"] == "KjitError"
    r = jrun("clear", "--yes")
    assert r["reset"] is True or r["removed"] is not None
    lookup._caches.clear()
    assert jrun("ls") == [] and get(100).cache_hit is False
    lookup._caches.clear()
    assert get(100).cache_hit is True


def test_clear_does_not_follow_links_out_of_the_cache(tmp_path):
    get(1)
    lookup.current().disk.close()
    lookup._caches.clear()
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    entries = cache.path() / "entries"
    import shutil
    shutil.rmtree(entries)
    entries.symlink_to(outside, target_is_directory=True)
    (cache.path() / "locks").mkdir(exist_ok=True)
    (cache.path() / "locks" / "x.lock").symlink_to(outside / "keep.txt")
    r = jrun("clear", "--yes")
    assert r["reset"] is True
    assert (outside / "keep.txt").read_text() == "mine" and not entries.exists()
    lookup._caches.clear()
    assert get(1).cache_hit is False


def test_value_file_outside_the_cache_is_never_read_or_deleted(tmp_path):
    get(5)
    victim = tmp_path / "victim.val"
    victim.write_bytes(b"secret")
    (k,) = lookup.current().disk.keys()
    lookup.current().disk.close()
    con = sqlite3.connect(cache.path() / "entries" / "cache.db")
    rel = os.path.relpath(victim, cache.path() / "entries")
    con.execute("UPDATE Cache SET mode = 2, filename = ?, value = NULL WHERE key = ?", (rel, k))
    con.commit()
    con.close()
    lookup.current().memory.clear()
    with pytest.warns(CacheWarning, match="not one kjit writes"):
        assert get(5).cache_hit is False          # recompiled, the planted row dropped
    assert victim.read_bytes() == b"secret"
    con = sqlite3.connect(cache.path() / "entries" / "cache.db")
    con.execute("UPDATE Cache SET mode = 2, filename = ?, value = NULL", (rel,))
    con.commit()
    con.close()
    assert jrun("verify", code=1)["corrupt"][0]["error"].startswith("value file name")
    jrun("clear", "--yes")
    assert victim.read_bytes() == b"secret"


# --- defect 7: links planted where kjit creates files; directories others control ---------------
def test_a_link_planted_where_a_lock_goes_is_not_followed(tmp_path):
    get(0)  # the directory and its databases exist
    k = cache.key_hash("test", {"i": 7})
    locks = cache.path() / "locks"
    locks.mkdir(exist_ok=True)
    target = tmp_path / "created-through-the-link"
    (locks / f"{k}.lock").symlink_to(target)
    assert get(7).cache_hit is False
    assert not target.exists() and not os.path.lexists(target)
    assert stat.S_ISREG(os.lstat(locks / f"{k}.lock").st_mode)
    lookup.current().memory.clear()
    assert get(7).cache_hit is True


def test_a_directory_every_user_can_write_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(shared))
    with pytest.warns(CacheWarning, match="writable by every user"):
        a = get(8)
    assert a.cache_hit is False and get(8).cache_hit is True   # memory only
    assert list(shared.iterdir()) == []
    res = CliRunner().invoke(cli, ["cache", "stats", "--json"])
    assert res.exit_code == 1 and "writable by every user" in json.loads(res.stdout)["error"]["message"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="only root can give a directory to another user")
def test_a_directory_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(theirs))
    with pytest.warns(CacheWarning, match="belongs to another user"):
        assert get(9).cache_hit is False
    assert list(theirs.iterdir()) == []
    res = CliRunner().invoke(cli, ["cache", "clear", "--json", "--yes"])
    assert res.exit_code == 1 and "another user" in json.loads(res.stdout)["error"]["message"]


def test_a_linked_subdirectory_is_refused(tmp_path):
    get(0)
    lookup.current().disk.close()
    lookup._caches.clear()
    elsewhere = tmp_path / "elsewhere"
    (cache.path() / "usage").rename(elsewhere)
    (cache.path() / "usage").symlink_to(elsewhere, target_is_directory=True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert get(10).cache_hit is False
    assert any("symbolic link" in str(w.message) for w in rec)


# --- listing: the fast paths agree with reading every entry ----------------------------------------
def test_ls_orders_agree_with_reading_every_entry():
    """`ls` sorts numbers without parsing metadata and asks SQLite for the rest; entries
    written by an older kjit (no "size:" or "used:" row), a damaged and a pickled metadata
    row must still land where their metadata puts them."""
    from kjit.cache import listing
    for i in range(30):
        cache.get_or_create("test", {"i": i}, lambda i=i: ObjectCode(
            PTX.replace(b"%d", str(i).encode()) + b"//" + b"x" * (i * 37 % 101), kind="ptx",
            arch=["compute_80", "compute_90", "compute_100"][i % 3], name=f"k{i:02d}.cu"))
    store = lookup.current().disk
    keys = sorted(store.keys())
    store.record_hits({k: (i * 7) % 13 + 1 for i, k in enumerate(keys)})
    store.usage.delete("size:" + keys[0])
    store.usage.delete("used:" + keys[1])
    store.usage.set("meta:" + keys[2], "{not json")
    store.close()
    with diskcache.Cache(str(cache.path() / "usage")) as u:
        u.set("meta:" + keys[3], {"pickled": True})
    every = [store.meta(k) for k in keys]
    for sort in ("last_used", "hits", "size", "created", "name", "arch", "kind"):
        for reverse in (False, True):
            want = sorted(every, key=listing.sort_key(sort), reverse=sort in listing.NUMERIC_SORTS)
            if reverse:
                want.reverse()
            for limit in (None, 1, 5):
                got = cache.ls(sort=sort, reverse=reverse, limit=limit)
                key = listing.sort_key(sort)
                assert [key(r) for r in got] == [key(r) for r in want[:limit]], (sort, reverse, limit)
    assert {r["key"] for r in cache.ls(arch="compute_90")} == {m["key"] for m in every if m["arch"] == "compute_90"}
    assert [r["label"] for r in cache.ls(kernel="k07")] == ["k07.cu"]


@pytest.mark.parametrize("content", ["[1, 2]", '{"%s": {"version": "x", "archs": "y"}}', "[" * 100000])
def test_a_damaged_nvrtc_facts_file_is_ignored_and_rewritten(content):
    from kjit.compiler import facts
    path = cache.cache_dir() / facts.FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    wheel = facts._wheel()
    path.write_text(content.replace("%s", str(wheel)))
    facts.nvrtc.cache_clear()
    try:
        got = facts.nvrtc()
        assert len(got["version"]) == 2 and all(isinstance(a, int) for a in got["archs"])
        if wheel:
            assert json.loads(path.read_text())[wheel] == got
    finally:
        facts.nvrtc.cache_clear()
