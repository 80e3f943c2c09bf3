"""Portable records (kjit/compiler/keys/portable.py, docs/cluster.md) between installs: the file a
record names is the one NVRTC would read, records are filed from any working directory,
their checks are bounded, and hostile records are refused (issue 40)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kjit.compiler.keys import portable, roots

ROOT = Path(__file__).resolve().parents[1]

# One "install": kjit with the toolkit directories of `tree` (a runtime-header wheel without
# crt/ and a CUDA toolkit's include directory, as toolkit_headers finds them for such an
# environment), compiling the source at `src` from the working directory `cwd`. Prints
# whether the result was a cache hit, how many NVRTC compiles ran, and the code's digest.
INSTALL = textwrap.dedent('''
    import hashlib, json, os, sys
    tree, src, cwd = sys.argv[1:4]
    os.chdir(cwd)
    from kjit.compiler import nvrtc, toolkit_headers
    if tree != "-":
        dirs = (os.path.join(tree, "wheel", "include"), os.path.join(tree, "cuda", "include"))
        toolkit_headers.located = lambda: {"cccl": None, "cudart": dirs[0]}
        toolkit_headers.dirs = lambda: dirs
    real, runs = nvrtc.compile_source, []
    def counted(*a, **k):
        runs.append(1)
        return real(*a, **k)
    nvrtc.compile_source = counted
    import kjit
    obj = kjit.compile(open(src).read(), arch="sm_90", name=src)
    print(json.dumps({"hit": obj.cache_hit, "compiles": len(runs),
                      "sha": hashlib.sha256(obj.code).hexdigest()}))
''')

HALF_USER = '''#include <cuda_fp16.h>
extern "C" __global__ void flavour(int* p) { p[threadIdx.x] = KJIT_TEST_FLAVOUR; }
'''


def install(tree, src: Path, cwd: Path, cache: Path, **env) -> dict:
    run_env = {**os.environ, "KJIT_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), **env}
    for name in ("KJIT_REMOTE_CACHE", "KJIT_OBSERVE"):
        if name not in env:
            run_env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", INSTALL, str(tree), str(src), str(cwd)],
                         env=run_env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def fake_install(base: Path, wheel_fp16: str, toolkit_fp16: str) -> Path:
    """A tree whose wheel and toolkit directories both hold a cuda_fp16.h (the toolkit's
    found second, as toolkit_headers adds it after the wheel for crt/)."""
    for part, text in (("wheel", wheel_fp16), ("cuda", toolkit_fp16)):
        d = base / part / "include"
        d.mkdir(parents=True)
        (d / "cuda_fp16.h").write_text(text)
    (base / "cuda" / "include" / "crt").mkdir()
    (base / "cuda" / "include" / "crt" / "mma.h").write_text("#pragma once\n")
    return base


ORIGINAL = "#pragma once\n#define KJIT_TEST_FLAVOUR 1\n"
PATCHED = "#pragma once\n#define KJIT_TEST_FLAVOUR 2\n"


@pytest.fixture
def requires_observer():
    from kjit.compiler.keys import observe
    if not observe.available("cuda"):
        pytest.skip(f"the compile observer is not available: {observe.describe()['reason']}")


def test_a_record_holds_only_for_the_file_nvrtc_reads_first(tmp_path, requires_observer):
    """The issue's case: install A's wheel and toolkit hold the same cuda_fp16.h; install B's
    wheel holds a patched one, its toolkit the original. B's NVRTC reads the wheel's (first
    in its search order): the record of A's compile must not hold in B, whose compile must
    give the patched binary, not A's."""
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text(HALF_USER)
    cache = tmp_path / "cache"   # one user's cache, shared by both environments
    a = fake_install(tmp_path / "a", ORIGINAL, ORIGINAL)
    b = fake_install(tmp_path / "b", PATCHED, ORIGINAL)
    first = install(a, src, src.parent, cache)
    assert first["hit"] is False and first["compiles"] == 1
    assert list((cache / "headers" / "portable").rglob("*.json")), "A filed no record"
    second = install(b, src, src.parent, cache)
    assert second["hit"] is False and second["sha"] != first["sha"]
    # what B compiles on its own, with no record to go by
    alone = install(b, src, src.parent, tmp_path / "fresh")
    assert second["sha"] == alone["sha"]


def test_a_record_holds_in_a_second_install_with_the_same_files(tmp_path, requires_observer):
    """The other side of the same check: a second install whose files are the same (at other
    paths) takes the first one's key from the record and compiles nothing."""
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text(HALF_USER)
    cache = tmp_path / "cache"
    first = install(fake_install(tmp_path / "a", ORIGINAL, PATCHED), src, src.parent, cache)
    second = install(fake_install(tmp_path / "b", ORIGINAL, PATCHED), src, src.parent, cache)
    assert first["compiles"] == 1
    assert second == {"hit": True, "compiles": 0, "sha": first["sha"]}


def test_records_are_filed_from_any_working_directory(tmp_path, requires_observer):
    """NVRTC probes the working directory for its built-in names (the builtin header, its
    name map, kjit's prelude): a compile run from elsewhere than the source's directory
    still files a record, and a second install run from a third directory uses it."""
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text(HALF_USER)
    elsewhere, third = tmp_path / "run", tmp_path / "job"
    elsewhere.mkdir()
    third.mkdir()
    cache = tmp_path / "cache"
    first = install(fake_install(tmp_path / "a", ORIGINAL, ORIGINAL), src, elsewhere, cache)
    assert first["compiles"] == 1
    assert list((cache / "headers" / "portable").rglob("*.json")), "no record filed"
    second = install(fake_install(tmp_path / "b", ORIGINAL, ORIGINAL), src, third, cache)
    assert second == {"hit": True, "compiles": 0, "sha": first["sha"]}


def test_nvrtc_builtin_names_in_the_working_directory_are_not_read(tmp_path, requires_observer):
    """Why those probes are no input: files of the built-in names in the working directory
    (here, each an #error) change nothing; the compile and its record stand."""
    from kjit.compiler.keys.observe import NVRTC_INTERNAL
    src = tmp_path / "src" / "k.cu"
    src.parent.mkdir()
    src.write_text(HALF_USER)
    planted = tmp_path / "planted"
    planted.mkdir()
    for name in NVRTC_INTERNAL:
        (planted / name).write_text(f"#error planted {name}\n")
    tree = fake_install(tmp_path / "a", ORIGINAL, ORIGINAL)
    clean = install(tree, src, src.parent, tmp_path / "c1")
    odd = install(tree, src, planted, tmp_path / "c2")
    assert odd["sha"] == clean["sha"] and odd["compiles"] == 1
    assert list((tmp_path / "c2" / "headers" / "portable").rglob("*.json"))


def test_a_relative_source_name_files_no_record(tmp_path, requires_observer, monkeypatch):
    """What the working directory decides is not portable: a source named relative
    ("sub/m.cu") has its "quoted" includes looked up from the working directory. The
    compile files a local manifest for this directory and no record for other installs,
    which would check this directory's header and compile their own."""
    import kjit
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "sub" / "mine.h").write_text("#define MINE 3\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KJIT_REMOTE_CACHE", raising=False)
    obj = kjit.compile('#include "mine.h"\nextern "C" __global__ void m(int* p) { p[0] = MINE; }',
                       arch="sm_90", name="sub/m.cu")
    assert obj.cache_hit is False and list((tmp_path / "cache" / "headers").rglob("*.json"))
    assert not list((tmp_path / "cache" / "headers" / "portable").rglob("*.json"))


# --- checking a record: its names, its bounds, its shape ------------------------------------------
@pytest.fixture
def two_cudart_dirs(tmp_path, monkeypatch):
    """This process's toolkit directories: a wheel's and a toolkit's, both "cudart"."""
    from kjit.compiler import toolkit_headers
    dirs = (str(tmp_path / "wheel"), str(tmp_path / "cuda"))
    for d in dirs:
        os.makedirs(d)
    monkeypatch.setattr(toolkit_headers, "located", lambda: {"cccl": None, "cudart": dirs[0]})
    monkeypatch.setattr(toolkit_headers, "dirs", lambda: dirs)
    return dirs


def test_each_directory_of_a_role_has_its_own_name(two_cudart_dirs):
    wheel, cuda = two_cudart_dirs
    name = portable.namer(None)
    assert name(os.path.join(wheel, "cuda_fp16.h")) == "<cudart>/cuda_fp16.h"
    assert name(os.path.join(cuda, "cuda_fp16.h")) == "<cudart.2>/cuda_fp16.h"
    # the compile key names both alike: the record, not the key, says which was read
    assert roots.key_path(os.path.join(cuda, "cuda_fp16.h")) == "<cudart>/cuda_fp16.h"


def record(**fields) -> dict:
    return {"key": "ab" * 32, "read": [], "probed": [], "absent": [], **fields}


class Tier:
    """A shared tier that answers every record request with `payload` (an unsigned tier
    anyone can write to)."""

    def __init__(self, payload):
        self.payload = payload

    def get_signed(self, k):
        return self.payload


@pytest.fixture
def offered(tmp_path, monkeypatch):
    """found(record or bytes): what find() makes of it, offered by the shared tier."""
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "cache"))   # no local record

    def found(rec):
        payload = rec if isinstance(rec, bytes) else json.dumps({"records": [rec]}).encode()
        monkeypatch.setattr(portable, "_tier", lambda: Tier(payload))
        return portable.find({"schema": portable.SCHEMA, "name": "/x.cu"}, None)
    return found


def fp16(text: str) -> list:
    return ["<cudart>/cuda_fp16.h", hashlib.sha256(text.encode()).hexdigest(), len(text)]


def test_a_read_file_is_checked_where_nvrtc_finds_it(two_cudart_dirs, offered):
    wheel, cuda = two_cudart_dirs
    Path(cuda, "cuda_fp16.h").write_text(ORIGINAL)
    rec = record(read=[fp16(ORIGINAL)])
    assert offered(rec) is None          # the wheel has none: not the toolkit's copy
    Path(wheel, "cuda_fp16.h").write_text(PATCHED)
    assert offered(rec) is None          # the wheel's differs
    Path(wheel, "cuda_fp16.h").write_text(ORIGINAL)
    k, snap = offered(rec)
    assert k == rec["key"] and list(snap.files) == [os.path.join(wheel, "cuda_fp16.h")]
    # the size is part of the record: a file of another size is not even read
    assert offered(record(read=[[*fp16(ORIGINAL)[:2], len(ORIGINAL) + 1]])) is None


def test_an_absent_path_must_still_be_absent(two_cudart_dirs, offered):
    wheel, cuda = two_cudart_dirs
    Path(cuda, "cuda_fp16.h").write_text(ORIGINAL)
    rec = record(read=[["<cudart.2>/cuda_fp16.h", *fp16(ORIGINAL)[1:]]],
                 absent=["<cudart>/cuda_fp16.h"])
    assert offered(rec)[0] == rec["key"]
    Path(wheel, "cuda_fp16.h").write_text(ORIGINAL)   # now found first: NVRTC reads this one
    assert offered(rec) is None


def test_many_absent_paths_are_checked_within_bounds(two_cudart_dirs, offered, monkeypatch):
    """The round's record listed 200,000 absent paths and took 261 s to check: a record over
    MAX_ENTRIES is refused unchecked, and one within it checks in linear time."""
    many = [f"<cudart>/missing/{i}.h" for i in range(200_000)]
    t0 = time.monotonic()
    assert offered(record(absent=many)) is None
    assert time.monotonic() - t0 < 2.0
    within = many[:portable.MAX_ENTRIES]
    t0 = time.monotonic()
    k, snap = offered(record(absent=within))
    assert time.monotonic() - t0 < 10.0 and sum(len(e[4]) for e in snap.dirs.values()) == len(within)
    monkeypatch.setattr(portable, "CHECK_S", 0.0)   # and the whole check has a deadline
    assert offered(record(absent=within)) is None


def test_a_record_naming_a_huge_file_is_refused_unread(two_cudart_dirs, offered):
    """A record naming a 3 GiB file read it whole (3 GB of memory)."""
    import resource
    wheel, _ = two_cudart_dirs
    with open(Path(wheel, "cuda_fp16.h"), "wb") as f:   # sparse: 3 GiB without the disk space
        f.truncate(3 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sha = "00" * 32
    assert offered(record(read=[["<cudart>/cuda_fp16.h", sha, 3 << 30]])) is None
    assert offered(record(read=[["<cudart>/cuda_fp16.h", sha, 100]])) is None  # the stat says no
    assert offered(record(read=[["<cudart>/cuda_fp16.h", sha]])) is None
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 256 << 10  # KiB


HOSTILE = [
    None, [], "x", 7, {}, {"key": "ab" * 32},
    record(key=None), record(key="../../etc"), record(key="AB" * 32), record(key=["ab"]),
    record(read={"ab": 1}), record(read=[["<cudart>/x.h"]]), record(read=[[1, 2, 3]]),
    record(read=[["<cudart>/x.h", "00" * 32, -1]]), record(read=[["<cudart>/x.h", "00" * 32, 1.5]]),
    record(read=[["<cudart>/x.h", "00" * 32, True]]), record(read=[["<cudart>/x.h", "00" * 32, 10 ** 30]]),
    record(probed=[None]), record(probed=[["x"]]), record(absent=[{}]), record(absent="abc"),
    record(absent=["relative/path.h"]), record(absent=["<nosuchrole>/x.h"]),
    record(absent=["<cudart>/\0x"]), record(probed=["<cudart.7>/x.h"]),
    record(absent=["<cudart>/" + "a" * 5000]), record(absent=[1]),
    b"[" * 100_000, b"\xff\xfe", b'{"records": [' + b" " * (8 << 20) + b"]}", b'{"records": 5}',
]


@pytest.mark.parametrize("rec", HOSTILE, ids=[f"shape{i}" for i in range(len(HOSTILE))])
def test_hostile_record_shapes_are_refused(two_cudart_dirs, offered, rec):
    """Records from an unsigned tier can have any shape: each is a miss, never an error,
    never a key."""
    assert offered(rec) is None


# --- round 2's regressions: prune on a full disk ------------------------------------------------
NO_INODES = r'''
set -e
mount -t tmpfs -o size=8m,nr_inodes=200 kjit-test "$MNT"
export KJIT_CACHE_DIR="$MNT/cache"
for i in 1 2 3 4 5 6; do
  "$PY" -m kjit.cli.main compile "$SRC" --arch sm_90 -D N=$i -o "$MNT/o.cubin" >/dev/null
done
rm "$MNT/o.cubin"
mkdir "$MNT/fill"; i=0; while touch "$MNT/fill/$i" 2>/dev/null; do i=$((i+1)); done
echo "inodes_free=$(df -i "$MNT" | tail -1 | awk '{print $4}')"
set +e
"$PY" -m kjit.cli.main cache prune --max-size 1K --json > "$OUT/size.json"; echo "rc_size=$?"
rm -r "$MNT/fill"
"$PY" -m kjit.cli.main cache verify --json > "$OUT/verify.json"; echo "rc_verify=$?"
'''


def test_prune_works_on_a_disk_without_free_inodes(tmp_path):
    """A disk is full when it has no inodes left, with megabytes free: SQLite cannot create
    the -wal file it opens a database with, and `kjit cache prune` said the cache could not
    be opened, although docs/cli.md says prune works on a full disk. A real tmpfs of 200
    inodes (in a private mount namespace), every one taken."""
    import shutil
    if not shutil.which("unshare"):
        pytest.skip("no unshare: cannot mount a small filesystem")
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* y) { y[0] = N; }\n')
    env = dict(os.environ, MNT=str(mnt), OUT=str(out), SRC=str(src), PY=sys.executable,
               PYTHONPATH=str(ROOT))
    cmd = ["unshare", "-m", "sh", "-c", NO_INODES] if os.geteuid() == 0 else \
          ["unshare", "-r", "-m", "sh", "-c", NO_INODES]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if "inodes_free=" not in res.stdout:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()[-300:]}")
    lines = dict(line.split("=", 1) for line in res.stdout.split())
    assert lines["inodes_free"] == "0", res.stdout
    assert lines["rc_size"] == "0", (out / "size.json").read_text()
    pruned = json.loads((out / "size.json").read_text())
    assert pruned["removed"] == 6 and pruned["entries_left"] == 0
    assert lines["rc_verify"] == "0" and not json.loads((out / "verify.json").read_text())["corrupt"]
