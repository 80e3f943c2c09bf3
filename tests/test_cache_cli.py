"""`kjit cache ...`: every command, as text and as --json, through click's CliRunner."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kjit
import kjit.cache
from kjit.cache import lookup
from kjit.cli.main import cli


def run(*args, code=0):
    res = CliRunner().invoke(cli, ["cache", *args])
    assert res.exit_code == code, (res.output, res.exception)
    return res


def jrun(*args, code=0):
    return json.loads(run(*args, "--json", code=code).output)


@pytest.fixture
def filled(saxpy_src, template_src, monkeypatch):
    monkeypatch.setenv("KJIT_CACHE_SAVE_SOURCE", "1")
    a = kjit.compile(saxpy_src, arch="sm_90")
    kjit.compile(saxpy_src, arch="sm_90")
    b = kjit.compile(template_src, arch="sm_80", name_expressions=["axpy<float>"])
    lookup.current().flush_hits()
    return a, b


def test_path():
    assert run("path").output.strip() == str(kjit.cache.path())
    assert jrun("path") == {"path": str(kjit.cache.path())}


def test_ls_filters_and_sorts(filled):
    text = run("ls").output
    assert "saxpy" in text and "sm_80" in text and "KEY" in text
    rows = jrun("ls")
    assert len(rows) == 2
    assert [r["arch"] for r in jrun("ls", "--arch", "sm_90")] == ["sm_90"]
    assert [r["arch"] for r in jrun("ls", "--kernel", "axpy<float>")] == ["sm_80"]
    assert jrun("ls", "--kernel", "nothing-like-this") == []
    by_hits = jrun("ls", "--sort", "hits")
    assert by_hits[0]["hits"] >= by_hits[1]["hits"] and by_hits[0]["kernels"] == ["saxpy"]
    assert jrun("ls", "--sort", "hits", "--reverse")[0]["hits"] <= by_hits[0]["hits"]
    assert len(jrun("ls", "--limit", "1")) == 1
    assert "(no entries)" in run("ls", "--arch", "sm_75").output


def test_show(filled, saxpy_src):
    key = next(r["key"] for r in jrun("ls") if r["arch"] == "sm_90")
    text = run("show", key[:10]).output
    assert key in text and "options" in text and "saxpy" in text and "nvrtc" in text
    assert saxpy_src.strip() not in text
    assert saxpy_src.strip() in run("show", key, "--source").output
    info = jrun("show", key)
    assert info["key"] == key and info["kind"] == "cubin" and "log" in info and "source" not in info
    assert jrun("show", key, "--source")["source"] == saxpy_src
    tkey = next(r["key"] for r in jrun("ls") if r["arch"] == "sm_80")
    assert "axpy<float>" in jrun("show", tkey)["symbols"]


def test_show_bad_keys(filled):
    assert "no cache entry" in run("show", "ffff0000", code=1).output
    assert "hex digits" in run("show", "zz", code=2).output


def test_stats(filled):
    s = jrun("stats")
    assert (s["entries"], s["hits"], s["misses"]) == (2, 1, 2)
    assert s["hit_rate"] == pytest.approx(1 / 3, abs=1e-3) and s["bytes"] > 0
    assert "hit rate   33.3%" in run("stats").output


def test_clear(filled, monkeypatch):
    from kjit.cli import common
    # no terminal to ask on (a script, CI), or --json: refused without --yes, nothing removed
    res = CliRunner().invoke(cli, ["cache", "clear"])
    assert res.exit_code == 2 and "pass --yes" in res.output and "no terminal" in res.output
    res = CliRunner().invoke(cli, ["cache", "clear", "--json"])
    assert res.exit_code == 2 and json.loads(res.output)["error"]["type"] == "UsageError"
    assert len(jrun("ls")) == 2
    # on a terminal it asks, saying what and where; declining removes nothing, exit 1, plainly
    monkeypatch.setattr(common, "on_terminal", lambda: True)
    res = CliRunner().invoke(cli, ["cache", "clear"], input="n\n")
    assert res.exit_code == 1 and "nothing removed" in res.output
    assert "every entry of the local cache in" in res.output and "interrupted" not in res.output
    assert len(jrun("ls")) == 2
    assert run("clear", "--yes").output.strip() == "removed 2 entries"
    assert jrun("clear", "--yes") == {"removed": 0, "unreadable_removed": 0, "reset": False}


def test_prune(filled):
    assert "needs" in run("prune", code=2).output
    assert jrun("prune", "--older-than", "1d")["removed"] == 0
    r = jrun("prune", "--max-size", "0")
    assert r["removed"] == 2 and jrun("ls") == []
    assert "removed 0 entries" in run("prune", "--older-than", "1h").output
    assert "duration" in run("prune", "--older-than", "soon", code=2).output
    assert "size" in run("prune", "--max-size", "huge", code=2).output


def test_verify(filled):
    r = jrun("verify")
    assert r == {"checked": 2, "ok": 2, "corrupt": [], "unreadable": 0}
    disk = lookup.current().disk
    k = disk.keys()[0]
    disk.entries.set(k, disk.get_blob(k)[:-1])
    bad = jrun("verify", code=1)
    assert bad["ok"] == 1 and bad["corrupt"][0]["key"] == k
    assert "1 ok, 0 corrupt" in run("verify").output


def test_export_import(filled, tmp_path, monkeypatch, saxpy_src):
    out = tmp_path / "cluster.zip"
    assert jrun("export", str(out))["exported"] == 2
    assert "exported 2 entries" in run("export", str(out)).output
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node2"))
    assert jrun("import", str(out))["imported"] == 2
    assert "2 already present" in run("import", str(out)).output
    assert kjit.compile(saxpy_src, arch="sm_90").cache_hit is True
    (tmp_path / "junk.zip").write_bytes(b"junk")
    assert "not a kjit cache export" in run("import", str(tmp_path / "junk.zip"), code=1).output


def test_help_lists_every_command():
    text = run("--help").output
    for cmd in ("path", "ls", "show", "stats", "clear", "prune", "verify", "export", "import"):
        assert cmd in text


def test_ls_text_shows_a_first_page(monkeypatch):
    import kjit.cli.cache as cli_cache
    from kjit.objectcode import ObjectCode
    monkeypatch.setattr(cli_cache, "PAGE", 3)
    for i in range(5):
        kjit.cache.get_or_create("t", {"i": i}, lambda i=i: ObjectCode(
            b".version 9.0\n.target sm_90\n.entry k%d()\n{\nret;\n}\n" % i, kind="ptx"))
    text = run("ls").output
    assert len(text.splitlines()) == 1 + 3 + 1 and "--limit 0 lists every entry" in text
    assert len(run("ls", "--limit", "0").output.splitlines()) == 1 + 5
    assert len(jrun("ls")) == 5 and len(jrun("ls", "--limit", "2")) == 2


# --- prune on a full disk ------------------------------------------------------------------------
FULL_DISK = r'''
set -e
mount -t tmpfs -o size=2m kjit-test "$MNT"
export KJIT_CACHE_DIR="$MNT/cache"
for i in 1 2 3 4 5 6; do
  "$PY" -m kjit.cli.main compile "$SRC" --arch sm_90 -D N=$i -o "$MNT/o.cubin" >/dev/null
done
rm "$MNT/o.cubin"
dd if=/dev/zero of="$MNT/filler" bs=4k 2>/dev/null || true
echo "free=$(df -k "$MNT" | tail -1 | awk '{print $4}')"
set +e
"$PY" -m kjit.cli.main cache prune --older-than 1h --json > "$OUT/old.json"; echo "rc_old=$?"
"$PY" -m kjit.cli.main cache prune --max-size 40K --json > "$OUT/size.json"; echo "rc_size=$?"
rm "$MNT/filler"
"$PY" -m kjit.cli.main cache verify --json > "$OUT/verify.json"; echo "rc_verify=$?"
"$PY" -m kjit.cli.main cache ls --json > "$OUT/ls.json"; echo "rc_ls=$?"
'''


def test_prune_works_on_a_full_disk(tmp_path):
    """A real 2 MB filesystem (tmpfs in a private mount namespace), filled to the last
    block: prune must still free space, and leave a cache that verifies."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    if not shutil.which("unshare"):
        pytest.skip("no unshare: cannot mount a small filesystem")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* y) { y[0] = N; }\n')
    root = str(Path(kjit.__file__).resolve().parents[1])
    env = dict(os.environ, MNT=str(mnt), OUT=str(out), SRC=str(src), PY=sys.executable,
               PYTHONPATH=root)
    cmd = ["unshare", "-m", "sh", "-c", FULL_DISK] if os.geteuid() == 0 else \
          ["unshare", "-r", "-m", "sh", "-c", FULL_DISK]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if "free=" not in res.stdout:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()[-300:]}")
    lines = dict(line.split("=", 1) for line in res.stdout.split())
    assert lines["free"] == "0", res.stdout
    assert lines["rc_old"] == "0", res.stderr
    assert json.loads((out / "old.json").read_text())["removed"] == 0   # all are new
    assert lines["rc_size"] == "0", res.stderr
    pruned = json.loads((out / "size.json").read_text())
    assert pruned["removed"] >= 1 and pruned["disk_bytes"] <= 40 * 1024
    assert pruned["entries_left"] == 6 - pruned["removed"]
    assert lines["rc_verify"] == "0", res.stderr
    verified = json.loads((out / "verify.json").read_text())
    assert verified["ok"] == pruned["entries_left"] and not verified["corrupt"]
    left = {r["key"] for r in json.loads((out / "ls.json").read_text())}
    assert left and not left & set(pruned["keys"])


def test_the_in_place_prune_keeps_the_rest_intact(filled, monkeypatch, saxpy_src):
    """The path a full disk takes, on any machine: same choices, same report, a cache
    that verifies and still serves what it kept."""
    from kjit.cache import pruning
    monkeypatch.setattr(pruning, "disk_full", lambda path: True)
    # with its source saved, this entry is large enough for a value file beside the database
    kjit.compile(saxpy_src + "\n//" + "x" * 60000 + "\n", arch="sm_90")
    entries_dir = lookup.current().path / "entries"
    assert any(entries_dir.rglob("*.val"))
    keys = {r["key"] for r in jrun("ls")}
    assert jrun("prune", "--older-than", "1d")["removed"] == 0
    oldest = jrun("ls", "--sort", "last_used", "--reverse")[0]["key"]
    one = jrun("prune", "--max-size", str(lookup.current().disk.volume() - 1))
    assert one["keys"] == [oldest] and one["entries_left"] == 2
    r = jrun("prune", "--max-size", "1")
    assert r["removed"] == 2 and r["entries_left"] == 0 and set(r["keys"]) == keys - {oldest}
    assert jrun("ls") == [] and jrun("verify")["corrupt"] == []
    assert not any(entries_dir.rglob("*.val"))
    again = kjit.compile(saxpy_src, arch="sm_90")     # the cache works on afterwards
    assert not again.cache_hit and kjit.compile(saxpy_src, arch="sm_90").cache_hit


def test_ls_and_show_name_kernels_as_cpp_does(template_src):
    """Not the lowered (mangled) names nor the source's file name: a name expression as
    written, a C++ kernel by its qualified name (with its parameters where it is overloaded),
    an extern "C" one as it is; LTO-IR, whose kernels are known after linking, by the name
    expressions it was compiled with."""
    src = template_src + r'''
namespace ns { __global__ void fill(int* p) { p[0] = 1; } }
__global__ void over(int* p) { p[0] = 1; }
__global__ void over(float* p) { p[0] = 1; }
extern "C" __global__ void plain_c(int* p) { p[0] = 1; }
'''
    kjit.compile(src, arch="sm_90", name_expressions=["axpy<float>", "axpy<double>"])
    kjit.compile(src, arch="sm_90", target="ltoir", name_expressions=["axpy<float>"])
    by_kind = {r["kind"]: r for r in jrun("ls")}
    assert sorted(by_kind["cubin"]["names"]) == sorted(
        ["axpy<float>", "axpy<double>", "ns::fill", "over(int*)", "over(float*)", "plain_c"])
    assert any(k.startswith("_Z") for k in by_kind["cubin"]["kernels"])   # --json keeps both
    assert by_kind["ltoir"]["names"] == ["axpy<float>"]
    text = run("ls").output
    assert "_Z" not in text and "kernel.cu" not in text
    cubin_line = next(line for line in text.splitlines() if " cubin " in line)
    assert "axpy<double>" in cubin_line and "ns::fill" in cubin_line and "over(float*)" in cubin_line
    shown = run("show", by_kind["cubin"]["key"]).output
    kernels_line = next(line for line in shown.splitlines() if line.startswith("kernels"))
    assert "ns::fill" in kernels_line and "_Z" not in kernels_line
    # and --kernel finds them by those names
    for name in ("ns::fill", "over(float*)", "axpy<double>"):
        assert [r["kind"] for r in jrun("ls", "--kernel", name)] == ["cubin"], name
    assert {r["kind"] for r in jrun("ls", "--kernel", "axpy<float>")} == {"cubin", "ltoir"}
    assert jrun("ls", "--kernel", "ns::nothing") == []
