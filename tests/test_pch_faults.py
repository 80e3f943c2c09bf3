"""Precompiled headers under faults (issue 40): a full temporary directory, a PCH file cut
short or replaced, a leftover directory named for an impossible pid, and KJIT_PCH's words.
Each falls back to a plain compile, counted in pch.stats(), with the binary a plain compile
gives; none ends the process or turns PCHs off. Scenarios that killed the process on
33e3ae6 (SIGBUS) run in a process of their own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kjit
from kjit.compiler import pch
from kjit.compiler.keys import observe

ROOT = Path(kjit.__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not observe.available("cuda"),
                                reason="the compile observer (kjit/compiler/keys/_observe.c) is not "
                                       "built here: precompiled headers are off without it")

PROLOGUE = "#include <cuda/std/cstdint>\n"


def source(i: int) -> str:
    return PROLOGUE + f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}.5f; }}\n'


def _env(tmp_path: Path, **extra: str) -> dict:
    return dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"),
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **extra)


# A process that compiles source(0..2) (the third from the PCH the second built), does
# {damage} to the PCH file, compiles source(7) and source(8), and prints what happened, with
# the binaries of plain compiles (KJIT_PCH=0) of the same sources.
SCRIPT = textwrap.dedent('''
    import json, os, shutil, sys
    import kjit
    from kjit.compiler import pch
    def source(i):
        return {prologue!r} + 'extern "C" __global__ void k%d(float* x) {{ x[0] = %d.5f; }}\\n' % (i, i)
    first = [kjit.compile(source(i), arch="sm_90", cache=False) for i in range(3)]
    files = pch.files()
    path = files[0] if files else None
    damage = sys.argv[1]
    if damage == "truncate":
        os.truncate(path, os.path.getsize(path) // 2)
    elif damage == "empty":
        os.truncate(path, 0)
    elif damage == "replace":        # another process's PCH of the same prologue
        os.replace(sys.argv[2], path)
    after = [kjit.compile(source(i), arch="sm_90", cache=False) for i in (7, 8)]
    stats = pch.stats()
    os.environ["KJIT_PCH"] = "0"
    plain = [kjit.compile(source(i), arch="sm_90", cache=False) for i in (7, 8)]
    if len(sys.argv) > 2 and damage == "keep":
        shutil.copy(path, sys.argv[2])
    print(json.dumps({{"first": [o.metadata.get("pch") for o in first],
                      "after": [o.metadata.get("pch") for o in after],
                      "same": [a.code == p.code and a.log == p.log for a, p in zip(after, plain)],
                      "stats": stats}}))
''').format(prologue=PROLOGUE)


def _run(tmp_path: Path, *args: str, env: dict | None = None, prefix: tuple = ()) -> dict:
    res = subprocess.run([*prefix, sys.executable, "-c", SCRIPT, *args],
                         env=env or _env(tmp_path), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, f"status {res.returncode}: {res.stderr[-3000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_a_pch_file_cut_short_is_rebuilt_not_mapped(tmp_path, damage):
    """Round 4 of issue 40: half a PCH file killed the process with SIGBUS on 33e3ae6 (NVRTC
    maps it). The next compile runs without it (counted: damaged), the one after builds it again."""
    got = _run(tmp_path, damage)
    assert got["first"] == [None, "created", "used"]
    assert got["after"] == [None, "created"]
    assert got["stats"]["damaged"] == 1 and got["stats"]["rejected"] == 0
    assert got["same"] == [True, True]


def test_a_pch_file_replaced_by_another_processs_is_rebuilt(tmp_path):
    """Round 4 of issue 40: a swapped PCH file was refused by NVRTC and its prologue never had
    a PCH again in the process (33e3ae6). Another process's PCH of the very same prologue
    (which NVRTC cannot use) takes the file's place."""
    foreign = tmp_path / "foreign.pch"
    got = _run(tmp_path, "keep", str(foreign))
    assert got["first"] == [None, "created", "used"] and foreign.stat().st_size > 0
    got = _run(tmp_path, "replace", str(foreign))
    assert got["after"] == [None, "created"]
    assert got["stats"]["damaged"] == 1 and got["same"] == [True, True]


def _small_tmpfs_prefix(mount: Path) -> tuple:
    """A command prefix that runs its command in a mount namespace of its own, with a 2 MiB
    tmpfs on `mount`; None where this machine cannot make one (no unshare, no permission)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    probe = subprocess.run([unshare, *user, "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=2m tmpfs {mount} && df -k {mount}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return None
    return (unshare, *user, "--mount", "sh", "-c",
            f'mount -t tmpfs -o size=2m tmpfs {mount} && exec "$0" "$@"')


def test_a_full_temporary_directory_compiles_without_a_pch(tmp_path):
    """Round 4 of issue 40: a full $TMPDIR ended the process with SIGBUS on 33e3ae6: NVRTC backs
    a PCH compile's heap with a sparse file there and does not check its writes. A real small
    tmpfs as $TMPDIR: every compile is plain (counted: no_space), the process lives."""
    small = tmp_path / "small"
    small.mkdir()
    prefix = _small_tmpfs_prefix(small)
    if prefix is None:
        pytest.skip("no tmpfs can be mounted here (unshare --mount not permitted): "
                    "test_no_room_is_counted_and_the_compile_is_plain covers the check")
    got = _run(tmp_path, "none", env=_env(tmp_path, TMPDIR=str(small)), prefix=prefix)
    assert got["first"] == [None, None, None] and got["after"] == [None, None]
    assert got["stats"]["no_space"] >= 3 and got["stats"]["created"] == 0
    assert got["same"] == [True, True]


NO_ROOM = textwrap.dedent('''
    import json, os, sys
    import kjit
    from kjit.compiler import pch, pch_files
    sources = json.loads(sys.argv[1])
    room = {"free": pch_files.SPACE_MARGIN}
    pch_files.free_bytes = lambda path: room["free"]
    kinds = [kjit.compile(s, arch="sm_90").metadata.get("pch") for s in sources[:3]]
    short_stats = pch.stats()
    room["free"] = 1 << 50
    kinds.append(kjit.compile(sources[3], arch="sm_90").metadata.get("pch"))
    room["free"] = 0
    short = kjit.compile(sources[4], arch="sm_90")
    kinds.append(short.metadata.get("pch"))
    stats = pch.stats()
    os.environ["KJIT_PCH"] = "0"
    same = short.code == kjit.compile(sources[4], arch="sm_90", cache=False).code
    del os.environ["KJIT_PCH"]
    room["free"] = 1 << 50
    kinds.append(kjit.compile(sources[5], arch="sm_90").metadata.get("pch"))
    print(json.dumps({"kinds": kinds, "short": short_stats, "stats": stats, "same": same}))
''')


def test_no_room_is_counted_and_the_compile_is_plain(tmp_path):
    """The free-space check itself, with the free space made small (for machines where no
    tmpfs can be mounted): no PCH is built, and one already built is not used while space
    is short; both compile plain, counted, and PCHs come back when space does. In a process
    of its own: one that made a PCH before the cache's heap was pinned makes no shared ones."""
    sources = [source(i).replace("x[0]", "x[1]") for i in range(6)]
    res = subprocess.run([sys.executable, "-c", NO_ROOM, json.dumps(sources)], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["kinds"] == [None, None, None, "created", None, "used"]
    assert got["short"]["no_space"] == 2 and got["short"]["created"] == 0
    assert got["stats"]["no_space"] == 3
    assert got["same"]


def test_room_counts_nvrtcs_directory_and_ours_on_one_file_system(tmp_path, monkeypatch):
    """NVRTC's heap file goes to $TMPDIR (else /tmp), the PCH to Python's temporary directory;
    on one file system their needs add up."""
    from kjit.compiler import pch_files
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setitem(pch._state, "dir", str(tmp_path))
    heap = max(pch._state["heap"], pch.HEAP_MIN)
    for free, use_ok, build_ok in [(heap + pch_files.SPACE_MARGIN - 1, False, False),
                                   (heap + pch_files.SPACE_MARGIN, True, False),
                                   (2 * heap + pch_files.SPACE_MARGIN, True, True)]:
        monkeypatch.setattr(pch_files, "free_bytes", lambda path, free=free: free)
        assert (pch._room(building=False), pch._room(building=True)) == (use_ok, build_ok), free


@pytest.mark.parametrize("pid", ["99999999999999999999", "4194304", "0"])
def test_a_leftover_directory_named_for_an_impossible_pid_is_swept(tmp_path, pid):
    """Round 4 of issue 40: `kjit-pch-<huge pid>-x` raised OverflowError in the sweep and turned
    PCHs off for the process (33e3ae6). No process has such a pid: its directory goes, and
    the process builds its PCHs."""
    left = tmp_path / f"kjit-pch-{pid}-x"
    left.mkdir()
    (left / "1.pch").write_bytes(b"x")
    got = _run(tmp_path, "none", env=_env(tmp_path, TMPDIR=str(tmp_path)))
    assert got["first"] == [None, "created", "used"] and got["stats"]["failed"] == 0
    assert not left.exists()


@pytest.mark.parametrize("word, on", [(w, True) for w in ("1", "true", "yes", "on", "ON", " Yes ")]
                         + [(w, False) for w in ("0", "false", "no", "off", "OFF", " No ")])
def test_kjit_pch_takes_every_switch_word(monkeypatch, word, on):
    """KJIT_PCH reads as every other KJIT_* switch (docs/cli.md's table): settings check it
    the same way, and a switched-off process builds no PCH."""
    from kjit.settings import SWITCHES, check_settings, env_switch
    assert "KJIT_PCH" in SWITCHES
    monkeypatch.setenv("KJIT_PCH", word)
    check_settings()
    assert pch.enabled() is on and env_switch("KJIT_PCH") is on
    if not on:
        before = pch.stats()
        tag = f"x[2] /* {word.strip()} */"
        objs = [kjit.compile(source(i).replace("x[0]", tag), arch="sm_90") for i in range(3)]
        assert not any("pch" in o.metadata for o in objs) and pch.stats() == before
