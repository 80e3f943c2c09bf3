"""Precompiled headers across processes (issue 35; kjit/compiler/pch_store.py, kjit/cache/pchdir.py):
a PCH built in one process serves the next ones, with the binary a plain compile gives; an
edit of any file its build read (a user header, a toolkit-like header, a header that appears
earlier in the search path) reaches the NEXT process; a PCH NVRTC refuses is rebuilt; one in
an untrusted directory is never read; PCHs count against the cache's size cap, are evicted
LRU with the entries, shown by stats and removed by clear. Each compile here runs in a fresh
process, as the loop the issue is about does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kjit
from kjit.compiler import pch_store
from kjit.compiler.keys import observe

ROOT = Path(kjit.__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not observe.available("cuda") or pch_store._module() is None,
    reason="the compile observer or the PCH heap pin (kjit/compiler/_observe.c, _pchheap.c) "
           "is not built here")

# One fresh process: compiles source(i) against the include directories, then the same
# source with PCHs off and no cache (the plain binary), and prints what happened.
SCRIPT = textwrap.dedent('''
    import hashlib, json, os, sys
    import kjit
    from kjit.compiler import pch, pch_store
    i, dirs = int(sys.argv[1]), json.loads(sys.argv[2])
    pre = sys.argv[3] if len(sys.argv) > 3 else ""
    if pre == "take_the_range":   # something else sits where the heap is pinned
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        got = libc.mmap(pch_store.PIN_ADDR, 1 << 20, mmap.PROT_READ,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x100000, -1, 0)
        assert got == pch_store.PIN_ADDR, got
    src = ('#include "h.h"\\n#include <tkit/a.h>\\n#include <cuda/std/cstdint>\\n'
           'extern "C" __global__ void k(float* x) {{ x[0] = twice(x[0]) + K + TK + %d.5f; }}\\n' % i)
    opts = kjit.CompileOptions(include_dirs=dirs)
    obj = kjit.compile(src, arch="sm_90", options=opts)
    stats = pch.stats()
    os.environ["KJIT_PCH"] = "0"
    plain = kjit.compile(src, arch="sm_90", options=opts, cache=False)
    print(json.dumps({"pch": obj.metadata.get("pch"), "same": obj.code == plain.code,
                      "log": obj.log, "plain_log": plain.log,
                      "code": hashlib.sha256(obj.code).hexdigest(), "stats": stats}))
''')


@pytest.fixture
def tree(tmp_path: Path) -> dict:
    """A user include directory, an empty one searched before it, and a toolkit-like one."""
    front, inc, tk = tmp_path / "front", tmp_path / "inc", tmp_path / "tk"
    for d in (front, inc, tk / "tkit"):
        d.mkdir(parents=True)
    (inc / "h.h").write_text("#pragma once\ntemplate <class T> __device__ T twice(T x) { return x + x; }\n"
                             "#define K 3\n")
    (tk / "tkit" / "a.h").write_text('#pragma once\n#include "b.h"\n')
    (tk / "tkit" / "b.h").write_text("#pragma once\n#define TK 10\n")
    time.sleep(0.05)   # written a moment before the compiles, as a user's edit is
    return {"dirs": [str(front), str(inc), str(tk)], "front": front, "inc": inc, "tk": tk,
            "cache": tmp_path / "cache"}


def _run(tree: dict, i: int, *extra: str, env: dict | None = None) -> dict:
    e = dict(os.environ, KJIT_CACHE_DIR=str(tree["cache"]),
             PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    e.pop("KJIT_PCH", None)
    e.update(env or {})
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(i), json.dumps(tree["dirs"]), *extra],
                         env=e, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, f"status {res.returncode}: {res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def _pchs(tree: dict) -> list[Path]:
    d = tree["cache"] / "pch"
    return sorted(d.glob("*.pch")) if d.is_dir() else []


def _settle() -> None:
    time.sleep(0.05)


def test_a_pch_built_in_one_process_serves_the_next_with_the_same_binary(tree):
    first = _run(tree, 1)                        # the prologue's first compile: none built
    assert first["pch"] is None and first["same"] and not _pchs(tree)
    second = _run(tree, 2)                       # its second, in another process: built by it
    assert second["pch"] == "created" and second["same"] and second["log"] == second["plain_log"]
    assert len(_pchs(tree)) == 1 and second["stats"]["created"] == 1
    for i in (3, 4):                             # every later process starts from it
        got = _run(tree, i)
        assert got["pch"] == "used" and got["same"] and got["log"] == got["plain_log"]
        assert got["stats"]["loaded"] == 1 and got["stats"]["created"] == 0


def _built(tree: dict) -> None:
    _run(tree, 1)
    assert _run(tree, 2)["pch"] == "created"
    assert _run(tree, 3)["pch"] == "used"
    _settle()


@pytest.mark.parametrize("edit", ["user header", "toolkit-like header", "nested toolkit-like header",
                                  "header appearing earlier in the search path"])
def test_an_edit_of_any_file_the_pch_read_reaches_the_next_process(tree, edit):
    _built(tree)
    before = _run(tree, 4)["code"]
    if edit == "user header":
        (tree["inc"] / "h.h").write_text(
            "#pragma once\ntemplate <class T> __device__ T twice(T x) { return x + x; }\n#define K 4\n")
    elif edit == "toolkit-like header":
        (tree["tk"] / "tkit" / "a.h").write_text('#pragma once\n#include "b.h"\n#define TK2 1\n')
    elif edit == "nested toolkit-like header":
        (tree["tk"] / "tkit" / "b.h").write_text("#pragma once\n#define TK 20\n")
    else:   # found absent in `front` when the PCH was built: now it shadows inc/h.h
        (tree["front"] / "h.h").write_text(
            "#pragma once\ntemplate <class T> __device__ T twice(T x) { return x * 2; }\n#define K 5\n")
    _settle()
    after = _run(tree, 4)
    assert after["same"], "a stale PCH served the next process"
    assert after["stats"]["stale"] == 1 and after["pch"] == "created"   # dropped, built again
    if edit != "toolkit-like header":
        assert after["code"] != before
    again = _run(tree, 5)
    assert again["pch"] == "used" and again["same"]


def test_a_pch_nvrtc_refuses_is_rebuilt_by_the_next_process(tree):
    _built(tree)
    (path,) = _pchs(tree)
    st = os.stat(path)
    with open(path, "r+b") as f:    # the same size, mtime and inode: only NVRTC can tell
        f.write(b"not a precompiled header" * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = _run(tree, 4)
    assert got["pch"] is None and got["same"] and got["log"] == got["plain_log"]
    assert got["stats"]["rejected"] == 1
    rebuilt = _run(tree, 5)
    assert rebuilt["pch"] == "created" and rebuilt["same"]
    assert _run(tree, 6)["pch"] == "used"


def test_a_pch_file_cut_short_is_never_mapped(tree):
    _built(tree)
    (path,) = _pchs(tree)
    os.truncate(path, os.path.getsize(path) // 2)
    got = _run(tree, 4)   # SIGBUS, were it mapped
    assert got["same"] and got["pch"] in (None, "created")
    assert _run(tree, 5)["pch"] in ("used", "created")


def test_a_process_whose_heap_cannot_be_pinned_compiles_plainly_and_keeps_the_pch(tree):
    _built(tree)
    got = _run(tree, 4, "take_the_range")
    assert got["same"] and got["pch"] is None and got["stats"]["unpinned"] == 1
    assert got["stats"]["rejected"] == 0 and len(_pchs(tree)) == 1
    assert _run(tree, 5)["pch"] == "used"   # still good for everyone else


def test_a_pch_in_an_untrusted_directory_is_never_used(tree):
    _built(tree)
    os.chmod(tree["cache"], 0o777)   # anyone could have planted it
    try:
        got = _run(tree, 4)
    finally:
        os.chmod(tree["cache"], 0o700)
    assert got["stats"]["loaded"] == 0 and got["pch"] is None and got["same"]


def _many(tree: dict, fraction: str) -> list:
    """How a PCH served each of six variants (constants ending in `fraction`) compiled by
    kjit.compile_many on two workers in a fresh process."""
    code = textwrap.dedent(f"""
        import json, os, kjit
        os.environ["KJIT_COMPILE_JOBS"] = "2"
        srcs = [('#include "h.h"\\n#include <tkit/a.h>\\n#include <cuda/std/cstdint>\\n'
                 'extern "C" __global__ void k(float* x) {{ x[0] = twice(x[0]) + K + TK + %d.{fraction}f; }}\\n' % i)
                for i in range(6)]
        objs = kjit.compile_many(srcs, arch="sm_90", options=kjit.CompileOptions(include_dirs={tree["dirs"]!r}),
                                 progress=False)
        print(json.dumps([o.metadata.get("pch") for o in objs]))
    """)
    env = dict(os.environ, KJIT_CACHE_DIR=str(tree["cache"]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_compile_many_in_a_fresh_process_uses_the_stored_pch_from_every_workers_first(tree):
    _built(tree)
    assert _many(tree, "25") == ["used"] * 6


# --- the cache's side: size cap, LRU, stats, clear ---------------------------------------------
def _fake_pch(base: Path, key: str, size: int, used: float) -> None:
    d = base / "pch"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    (d / f"{key}-abc.pch").write_bytes(os.urandom(size))
    rec = d / f"{key}.json"
    rec.write_text("{}")
    os.utime(rec, (used, used))


def test_pchs_count_against_the_size_cap_and_go_least_recently_used_first(monkeypatch):
    from kjit.cache import current_cache
    from kjit.cache.pchdir import items
    base = current_cache().path
    kjit.compile('extern "C" __global__ void k(int* x) { x[0] = 1; }', arch="sm_90")
    now = time.time()
    _fake_pch(base, "a" * 64, 3 << 20, now - 300)
    _fake_pch(base, "b" * 64, 3 << 20, now - 100)
    _fake_pch(base, "c" * 64, 3 << 20, now - 200)
    store = current_cache().disk
    store = store.managed() if hasattr(store, "managed") else store
    limit = store.volume() + (7 << 20)   # room for two of the three
    store.evict_lru(limit)
    assert sorted(i.stem[0] for i in items(base)) == ["b", "c"]   # a: the least recently used
    store.evict_lru(store.volume() + (4 << 20), keep_pch="c" * 64)
    assert [i.stem[0] for i in items(base)] == ["c"]
    assert len(store.keys()) == 1                                  # the entry was used later


def test_stats_show_the_pchs_and_clear_removes_them():
    from kjit.cache import current_cache
    base = current_cache().path
    kjit.compile('extern "C" __global__ void k(int* x) { x[0] = 2; }', arch="sm_90")
    _fake_pch(base, "d" * 64, 1 << 20, time.time())
    s = kjit.cache.stats()
    assert s["pch"]["files"] == 1 and s["pch"]["bytes"] >= 1 << 20
    from click.testing import CliRunner
    from kjit.cli.main import cli
    out = CliRunner().invoke(cli, ["cache", "stats"])
    assert "1 precompiled headers" in out.output, out.output
    kjit.cache.clear()
    assert not list((base / "pch").iterdir())
    assert kjit.cache.stats()["pch"] == {"files": 0, "bytes": 0}


def test_a_pch_too_large_for_the_cap_is_not_kept(monkeypatch, tmp_path):
    from kjit.cache import pch_stored
    monkeypatch.setenv("KJIT_CACHE_SIZE", "2M")
    assert not pch_stored("e" * 64, 3 << 20)
    assert pch_stored("e" * 64, 512 << 10)


def test_a_pch_and_its_binaries_serve_jobs_with_their_own_temporary_directory(tree, tmp_path):
    """NVRTC reads TMPDIR only for the file behind a PCH's heap: a job with another TMPDIR
    (SLURM's per-job one, a CI runner's) uses the stored PCH and hits the binaries made with
    it, and the binary is the same."""
    tmps = [tmp_path / "job1", tmp_path / "job2"]
    for t in tmps:
        t.mkdir()
    _run(tree, 1, env={"TMPDIR": str(tmps[0])})
    made = _run(tree, 2, env={"TMPDIR": str(tmps[0])})
    assert made["pch"] == "created"
    _settle()
    other = _run(tree, 3, env={"TMPDIR": str(tmps[1])})
    assert other["pch"] == "used" and other["same"] and other["stats"]["stale"] == 0


def test_a_pch_filed_meanwhile_from_headers_since_edited_is_not_taken(tree):
    """Another process filed a PCH under the key while this one built its own from the
    headers as they are now: save() keeps ours rather than hand back theirs (stale)."""
    from kjit.compiler.keys.snapshot import Snapshot
    _built(tree)
    d = tree["cache"] / "pch"
    [rec_file] = d.glob("*.json")
    key = rec_file.name[:-5]
    theirs = pch_store.load(d, key)
    assert theirs is not None
    (tree["inc"] / "h.h").write_text("#pragma once\ntemplate <class T> __device__ T twice(T x) "
                                     "{ return x + x; }\n#define K 7\n")
    _settle()
    assert not theirs.snapshot.check()    # their build read the header as it was
    tmp = pch_store.new_path(d, key)
    Path(tmp).write_bytes(b"ours")
    ours = pch_store.save(d, key, tmp, Snapshot.from_json(theirs.snapshot.to_json()), theirs.obs,
                          theirs.heap)
    assert ours is None or ours.path != theirs.path, "a PCH of the old header was handed back"


def test_workers_starting_together_build_one_pch_between_them(tree):
    """compile_many's workers meet a prologue no PCH exists for at the same moment: one
    builds it, the others wait for it and start from it (not one ~300 MB PCH each)."""
    served = _many(tree, "5")
    assert served.count("created") == 1 and served.count("used") == 5, served
    assert len(list((tree["cache"] / "pch").glob("*.pch"))) == 1
    assert not list((tree["cache"] / "pch").glob("*.building")), "a claim outlived its build"


def test_a_build_claim_of_a_dead_process_is_taken_over(tmp_path):
    d = tmp_path / "pch"
    d.mkdir(mode=0o700)
    assert pch_store.claim(d, "k") and pch_store.building(d, "k")
    assert not pch_store.claim(d, "k"), "a live builder's claim was taken"
    pch_store.release(d, "k")
    assert not pch_store.building(d, "k")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (d / "k.building").write_text(dead)
    assert not pch_store.building(d, "k")
    assert pch_store.claim(d, "k"), "a dead builder's claim was kept"
    pch_store.release(d, "k")


def test_a_compile_served_by_a_stored_pch_is_keyed_as_a_plain_compile(tree, tmp_path):
    """Keying reuses the digests the PCH's check just confirmed instead of reading its ~500
    headers again; the key must still be the one a plain compile derives from the files
    themselves (another cache directory: no manifest, no PCH)."""
    _built(tree)
    probe = textwrap.dedent('''
        import json, sys, kjit
        from kjit.compiler import pch
        keys = []
        kjit.cache.add_listener(lambda e: keys.append(e.key))
        src = (   # SCRIPT's source, braces and all
               '#include "h.h"\\n#include <tkit/a.h>\\n#include <cuda/std/cstdint>\\n'
               'extern "C" __global__ void k(float* x) {{ x[0] = twice(x[0]) + K + TK + %d.5f; }}\\n' % 6)
        obj = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(include_dirs=json.loads(sys.argv[1])))
        print(json.dumps([obj.metadata.get("pch"), keys]))
    ''')

    def key(cache: Path, **env: str) -> tuple:
        e = dict(os.environ, KJIT_CACHE_DIR=str(cache), **env,
                 PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        res = subprocess.run([sys.executable, "-c", probe, json.dumps(tree["dirs"])], env=e,
                             capture_output=True, text=True, timeout=400)
        assert res.returncode == 0, res.stderr[-3000:]
        served, keys = json.loads(res.stdout.strip().splitlines()[-1])
        return served, keys[-1]

    served, with_pch = key(tree["cache"])
    assert served == "used"
    assert key(tmp_path / "plain", KJIT_PCH="0") == (None, with_pch)


def test_keying_takes_a_known_digest_only_at_the_stat_it_was_known_at(tmp_path, monkeypatch):
    from kjit.compiler.keys import snapshot
    a, b = tmp_path / "a.h", tmp_path / "b.h"
    a.write_text("int a;\n")
    b.write_text("int b;\n")
    past = time.time() - 60
    for p in (a, b):
        os.utime(p, (past, past))
    started = time.time() + 1   # ctimes are now: keyable only for a compile started later
    time.sleep(0.05)

    def observed() -> observe.Observation:
        obs = observe.Observation()
        for p in (a, b):
            st = p.stat()
            obs.read[str(p)] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        obs.digests[str(a)] = "f" * 64
        return obs

    reads: list[str] = []
    real = snapshot.read_hash
    monkeypatch.setattr(snapshot, "read_hash", lambda p: reads.append(p) or real(p))
    _snap, read, _probed = snapshot.from_observation(observed(), started)
    assert dict(read) == {str(a): "f" * 64, str(b): real(str(b))} and reads == [str(b)]
    obs = observed()
    a.write_text("int A;\n")   # changed after the digest was known: the key is not made from it
    assert snapshot.from_observation(obs, started) is None
