"""The shared tier from the other ways in: linked results, `kjit build`, and the commands
`kjit cache ls/stats/clear --remote` and `kjit cache push`."""
from __future__ import annotations

import json

from click.testing import CliRunner

import kjit
import kjit.cache
from kjit.cache import remote
from kjit.cli.main import cli
from kjit.linker import link

ARCH = "sm_90"
MOD = r'''extern "C" __global__ void fill(float* p) { p[threadIdx.x] = 3.0f; }'''


def run(*args, code=0):
    res = CliRunner().invoke(cli, list(map(str, args)))
    assert res.exit_code == code, (res.output, res.exception)
    return res


def jrun(*args, code=0):
    return json.loads(run(*args, "--json", code=code).output)


def node(monkeypatch, tmp_path, name):
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / name))


def test_linked_results_go_through_the_tier(remote_env, tmp_path, monkeypatch):
    node(monkeypatch, tmp_path, "a")
    ptx = kjit.compile(MOD, arch=ARCH, target="ptx", options=kjit.CompileOptions(relocatable=True))
    first = link([ptx], arch=ARCH, backend="nvjitlink")
    node(monkeypatch, tmp_path, "b")
    events: list = []
    listener = kjit.cache.add_listener(events.append)
    try:
        again = link([ptx], arch=ARCH, backend="nvjitlink")
    finally:
        kjit.cache.remove_listener(listener)
    assert first.cache_hit is False and again.cache_hit is True
    assert [(e.namespace, e.event) for e in events] == [("link", "remote_hit")]
    assert again.code == first.code


def test_build_entries_go_through_the_tier(remote_env, tmp_path, monkeypatch):
    src = tmp_path / "lib.cu"
    src.write_text(MOD)
    args = ["build", src, "-o", tmp_path / "lib.fatbin", "--arch", "sm_80,sm_90", "--json"]
    node(monkeypatch, tmp_path, "ci")
    assert jrun(*args)["reused"] == 0
    node(monkeypatch, tmp_path, "worker")
    again = jrun(*args)
    assert again["reused"] == again["compiles"] == 3  # two cubins and the PTX


def test_push_warms_the_tier_from_a_local_build(redis_server, tmp_path, monkeypatch):
    for name in remote.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    node(monkeypatch, tmp_path, "ci")
    kjit.compile(MOD, arch=ARCH)
    kjit.compile(MOD, arch="sm_80")
    monkeypatch.setenv(remote.ENV_URL, redis_server.url)
    monkeypatch.setenv(remote.ENV_KEY, "secret")
    pushed = jrun("cache", "push")
    assert (pushed["pushed"], pushed["already_present"], pushed["signed"]) == (2, 0, True)
    assert jrun("cache", "push")["already_present"] == 2
    assert "pushed 0 entries" in run("cache", "push").output
    node(monkeypatch, tmp_path, "worker")
    assert kjit.compile(MOD, arch=ARCH).cache_hit is True


def test_ls_stats_and_clear_remote(remote_env, tmp_path, monkeypatch):
    node(monkeypatch, tmp_path, "a")
    kjit.compile(MOD, arch=ARCH)
    rows = jrun("cache", "ls", "--remote")
    assert len(rows) == 1 and rows[0]["kernels"] == ["fill"] and rows[0]["arch"] == ARCH
    assert rows[0]["signed"] is False and 6 * 86400 < rows[0]["ttl_s"] <= 7 * 86400
    assert "fill" in run("cache", "ls", "--remote").output
    stats = jrun("cache", "stats", "--remote")
    assert stats["entries"] == 1 and stats["bytes"] > rows[0]["size"]
    assert stats["server"]["redis_version"] and stats["signed"] is False
    text = run("cache", "stats", "--remote").output
    assert "NO: set KJIT_REMOTE_CACHE_KEY" in text and "entries    1" in text
    local = run("cache", "stats").output
    assert "remote" in local and "published 1" in local
    cleared = jrun("cache", "clear", "--remote", "--yes")
    assert cleared["removed"] == 1   # the entry ls showed; its record, where one was filed, too
    assert cleared["other"] in (0, 1)
    assert jrun("cache", "ls", "--remote") == []
    assert len(jrun("cache", "ls")) == 1, "clearing the remote cache touched the local one"


def test_remote_commands_without_a_tier_or_server_say_what_to_do(redis_server, monkeypatch):
    monkeypatch.delenv(remote.ENV_URL, raising=False)
    assert "KJIT_REMOTE_CACHE=redis://" in run("cache", "ls", "--remote", code=1).output
    redis_server.kill()
    monkeypatch.setenv(remote.ENV_URL, redis_server.url)
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    monkeypatch.setenv(remote.ENV_TIMEOUT, "1s")
    out = run("cache", "stats", "--remote", code=1).output
    assert "cannot be used" in out and "Traceback" not in out
