"""Tuning records: `kjit tune ls / show / clear`, and sharing them through the Redis tier."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kjit.cli.main import cli
from kjit.tune import store

from test_tune import CONFIGS, FakeTimer, make


def run(*args):
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.output


def test_ls_show_and_clear(monkeypatch):
    make(CONFIGS[:3], FakeTimer({128: 0.25})).tune(None, 2.0, 4096)
    make(CONFIGS[:3], FakeTimer()).tune(None, 2.0, 1024)
    code, out = run("tune", "ls", "--json")
    assert code == 0
    groups = json.loads(out)
    assert len(groups) == 2 and {json.dumps(g["key"]) for g in groups} == {'{"n": 4096}', '{"n": 1024}'}
    big = next(g for g in groups if g["key"] == {"n": 4096})
    assert big["kernel"] == "scale" and big["device"]["name"] == "Test GPU"
    assert big["best"]["ms"] == 0.25 and big["best"]["config"]["params"] == {"BS": 128}
    assert len(big["configs"]) == 3
    code, text = run("tune", "ls")
    assert code == 0 and "scale" in text and "n=4096" in text and "0.2500 ms" in text

    code, out = run("tune", "show", big["id"][:6], "--json")
    assert code == 0 and json.loads(out)["best"]["config"]["params"] == {"BS": 128}
    code, text = run("tune", "show", big["id"])
    assert code == 0 and "Test GPU (132 SMs" in text and "BS=128" in text
    code, text = run("tune", "show", "ffffffffffff")
    assert code == 1 and "no tuning result has an ID starting with" in text

    assert len(json.loads(run("tune", "ls", "--kernel", "cal", "--json")[1])) == 2
    code, out = run("tune", "clear", "--kernel", "nothing-like-it", "--json", "--yes")
    assert (code, json.loads(out)) == (0, {"removed": 0})
    code, out = run("tune", "clear", "--json", "--yes")
    assert (code, json.loads(out)) == (0, {"removed": 6})
    assert json.loads(run("tune", "ls", "--json")[1]) == []
    timer = FakeTimer()
    make(CONFIGS[:3], timer).tune(None, 2.0, 4096)   # cleared: timed again
    assert len(timer.calls) == 3


def test_records_are_cache_entries_that_survive_a_damaged_one(monkeypatch):
    """A damaged record is a miss for that configuration only: it is timed again."""
    make(CONFIGS[:2], FakeTimer()).tune(None, 2.0, 64)
    entries = store.entries()
    from kjit.cache import lookup
    c = lookup.current()
    victim = entries[0]["entry"]
    row = c.disk.tables()[0].sql("SELECT rowid FROM Cache WHERE key = ?", (victim,)).fetchone()
    assert row is not None
    c.disk.entries._sql("UPDATE Cache SET value = ? WHERE key = ?", (b"garbage", victim))
    c.memory.clear()
    timer = FakeTimer()
    with pytest.warns(Warning, match="corrupt"):
        make(CONFIGS[:2], timer).tune(None, 2.0, 64)
    assert len(timer.calls) == 1


def test_a_second_node_times_nothing_through_the_signed_redis_tier(remote_env, tmp_path, monkeypatch):
    from kjit.cache import remote
    monkeypatch.setenv(remote.ENV_KEY, "cluster secret")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node-a"))
    first = FakeTimer({256: 0.5})
    make(CONFIGS[:3], first).tune(None, 2.0, 4096)
    assert len(first.calls) == 3
    r = remote_env.client()
    values = [k for k in r.keys("*") if b"e:" in k]
    assert len(values) >= 3 and all(r.get(k).startswith(b"KJITSIG1") for k in values
                                    if not r.get(k).startswith(b"KJITNONE"))

    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node-b"))
    second = FakeTimer()
    res = make(CONFIGS[:3], second).tune(None, 2.0, 4096)
    assert second.calls == [] and res.measured == 0 and res.config.params == {"BS": 256}
    assert len(store.entries()) == 3   # kept on node b's own disk too

    # a node with another key refuses the values and times for itself
    monkeypatch.setenv(remote.ENV_KEY, "another secret")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node-c"))
    third = FakeTimer()
    with pytest.warns(Warning, match="refused"):
        make(CONFIGS[:3], third).tune(None, 2.0, 4096)
    assert len(third.calls) == 3
