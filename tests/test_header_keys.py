"""Exact keys for headers, fast: every change a compile could see recompiles, nothing else
does, in each way a key is found again: in process through change notification, in process
by stat check (notification off), and as a new process would (from a manifest on disk).
Two header locations: an -I directory, and a copy of a CCCL header placed before the
toolkit's directory. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kjit
from kjit.cache import lookup
from kjit.compiler import cached as compiled
from kjit.compiler import toolkit_headers
from kjit.compiler.keys import includes, manifest, snapshot, watch
from kjit.compiler.keys.snapshot import Snapshot
from kjit.errors import CompileError

REPO = Path(__file__).resolve().parents[1]
KERNEL = r'''
extern "C" __global__ void scale(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= FACTOR;
}
'''
I_SRC = "#include <coef.h>\n" + KERNEL
CCCL_HEADER = "cuda/std/__cccl/version.h"
CCCL_SRC = f"#include <{CCCL_HEADER}>\n#define FACTOR ((float)(CCCL_VERSION % 1000 + 2))\n" + KERNEL


def old(path, age=3600):
    t = time.time() - age
    os.utime(path, (t, t))


def write_same_size_keep_mtime(path: Path, text: str) -> None:
    """Rewrite in place with content of the same size and put mtime back (issue 16, item 6)."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    with open(path, "r+b") as f:
        f.write(text.encode())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def replace_by_rename(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    old(tmp)
    os.replace(tmp, path)


@pytest.fixture(params=["notified", "stat", "fresh"])
def view(request, monkeypatch):
    """How the next compile finds its key: "notified" (in process, inotify quiet or not),
    "stat" (in process, notification off), "fresh" (memo and memory dropped before every
    compile: the manifest on disk, as a new process). Headers count as old, as in a real
    tree: their stat is trusted at once (test_cache_key covers files written this instant,
    which are re-read while a coarse clock could hide a second write)."""
    monkeypatch.setattr(snapshot, "_RACY_NS", 0)
    if request.param == "notified" and not sys.platform.startswith("linux"):
        pytest.skip("change notification is Linux-only")
    if request.param == "notified":   # watch from the first repeat on, not the second
        monkeypatch.setattr(compiled, "STAT_CHECKS_BEFORE_WATCHING", 0)
    if request.param == "stat":
        monkeypatch.setitem(watch._state, "inotify", None)
        monkeypatch.setitem(watch._state, "failed", True)

    def compile_(src, **kw):
        if request.param == "fresh":
            compiled._memo.clear()
            includes._file_memo.clear()
            lookup.current().memory.clear()
        return kjit.compile(src, arch="sm_90", **kw)
    compile_.mode = request.param
    return compile_


def test_include_dir_header_every_change(view, tmp_path):
    first, inc = tmp_path / "first", tmp_path / "inc"
    first.mkdir()
    inc.mkdir()
    coef = inc / "coef.h"
    coef.write_text("#define FACTOR 2.0f\n")
    for p in (coef, first, inc):
        old(p)
    opts = kjit.CompileOptions(include_dirs=[str(first), str(inc)])
    a = view(I_SRC, options=opts)
    assert a.cache_hit is False
    assert view(I_SRC, options=opts).cache_hit is True
    coef.touch()                                                     # touch: same content
    assert view(I_SRC, options=opts).code == a.code
    assert view(I_SRC, options=opts).cache_hit is True
    write_same_size_keep_mtime(coef, "#define FACTOR 3.0f\n")       # edit, mtime restored
    b = view(I_SRC, options=opts)
    assert b.cache_hit is False and b.code != a.code
    assert view(I_SRC, options=opts).cache_hit is True
    replace_by_rename(coef, "#define FACTOR 4.0f\n")                # replaced by rename
    c = view(I_SRC, options=opts)
    assert c.cache_hit is False and c.code not in (a.code, b.code)
    assert view(I_SRC, options=opts).cache_hit is True
    (first / "coef.h").write_text("#define FACTOR 5.0f\n")           # shadows inc/coef.h
    d = view(I_SRC, options=opts)
    assert d.cache_hit is False and d.code not in (a.code, b.code, c.code)
    assert view(I_SRC, options=opts).cache_hit is True
    (first / "coef.h").unlink()                                      # back to inc/coef.h
    assert view(I_SRC, options=opts).code == c.code
    assert view(I_SRC, options=opts).cache_hit is True
    coef.unlink()                                                    # gone: NVRTC's own error
    with pytest.raises(CompileError, match=r'cannot open source file "coef.h"'):
        view(I_SRC, options=opts)


def test_cccl_header_copy_earlier_in_the_path(view, tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    old(shadow)
    opts = kjit.CompileOptions(include_dirs=[str(shadow)])
    wheel = view(CCCL_SRC, options=opts)                             # the wheel's header
    assert wheel.cache_hit is False
    assert view(CCCL_SRC, options=opts).cache_hit is True
    original = Path(toolkit_headers.dirs()[0], CCCL_HEADER).read_text()
    version = int(original.split("#define CCCL_VERSION", 1)[1].split()[0])
    copy = shadow / CCCL_HEADER
    (shadow / "cuda").mkdir()                                        # a directory on the way
    assert view(CCCL_SRC, options=opts).cache_hit is True
    copy.parent.mkdir(parents=True)
    copy.write_text(original.replace(str(version), str(version + 1)))  # a new shadowing header
    a = view(CCCL_SRC, options=opts)
    assert a.cache_hit is False and a.code != wheel.code
    copy.touch()
    assert view(CCCL_SRC, options=opts).cache_hit is True
    write_same_size_keep_mtime(copy, original.replace(str(version), str(version + 2)))
    b = view(CCCL_SRC, options=opts)
    assert b.cache_hit is False and b.code not in (wheel.code, a.code)
    assert view(CCCL_SRC, options=opts).cache_hit is True
    replace_by_rename(copy, original.replace(str(version), str(version + 3)))
    c = view(CCCL_SRC, options=opts)
    assert c.cache_hit is False and c.code not in (wheel.code, a.code, b.code)
    assert view(CCCL_SRC, options=opts).cache_hit is True
    copy.unlink()                                                    # the wheel's again
    assert view(CCCL_SRC, options=opts).code == wheel.code


def test_unrelated_new_file_in_a_searched_dir_still_hits(view, tmp_path):
    first, inc = tmp_path / "first", tmp_path / "inc"
    first.mkdir()
    inc.mkdir()
    (inc / "coef.h").write_text("#define FACTOR 2.0f\n")
    for p in (inc / "coef.h", first, inc):
        old(p)
    opts = kjit.CompileOptions(include_dirs=[str(first), str(inc)])
    view(I_SRC, options=opts)
    assert view(I_SRC, options=opts).cache_hit is True
    (first / "other.h").write_text("// not included\n")             # first/ changed...
    (inc / "notes.txt").write_text("x")
    assert view(I_SRC, options=opts).cache_hit is True               # ...coef.h is still inc's


def test_new_subdirectory_then_header_in_it(view, tmp_path):
    """A candidate watched through its nearest existing directory: the subdirectory appears
    first (still absent), then the header inside it (found)."""
    shadow, inc = tmp_path / "shadow", tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "sub" / "coef.h").write_text("#define FACTOR 2.0f\n")
    for p in (inc / "sub" / "coef.h", inc / "sub", inc):
        old(p)
    shadow.mkdir()
    old(shadow)
    src = "#include <sub/coef.h>\n" + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(shadow), str(inc)])
    a = view(src, options=opts)
    assert view(src, options=opts).cache_hit is True
    (shadow / "sub").mkdir()
    assert view(src, options=opts).cache_hit is True
    (shadow / "sub" / "coef.h").write_text("#define FACTOR 6.0f\n")
    b = view(src, options=opts)
    assert b.cache_hit is False and b.code != a.code


def test_symlinked_directory_swapped(view, tmp_path):
    """include_dirs are resolved when CompileOptions is made; a symlink below one is
    followed at each lookup, so swapping it changes what is read."""
    for v, val in (("v1", "2.0f"), ("v2", "7.0f")):
        (tmp_path / v).mkdir()
        (tmp_path / v / "coef.h").write_text(f"#define FACTOR {val}\n")
        old(tmp_path / v / "coef.h")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "cur").symlink_to(tmp_path / "v1")
    old(inc)
    src = "#include <cur/coef.h>\n" + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    a = view(src, options=opts)
    assert view(src, options=opts).cache_hit is True
    tmp_link = inc / "cur.new"
    tmp_link.symlink_to(tmp_path / "v2")
    os.replace(tmp_link, inc / "cur")                                # ln -sfn v2 inc/cur
    b = view(src, options=opts)
    assert b.cache_hit is False and b.code != a.code


def test_include_dir_replaced_by_renames(view, tmp_path):
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    (inc / "sub" / "coef.h").write_text("#define FACTOR 2.0f\n")
    old(inc / "sub" / "coef.h")
    src = '#include "sub/coef.h"\n' + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    a = view(src, options=opts)
    assert view(src, options=opts).cache_hit is True
    new = tmp_path / "inc.new"
    (new / "sub").mkdir(parents=True)
    (new / "sub" / "coef.h").write_text("#define FACTOR 8.0f\n")
    old(new / "sub" / "coef.h")
    os.rename(inc, tmp_path / "inc.old")
    os.rename(new, inc)
    b = view(src, options=opts)
    assert b.cache_hit is False and b.code != a.code


def test_write_through_a_hard_link_elsewhere(view, tmp_path):
    inc, other = tmp_path / "inc", tmp_path / "other"
    inc.mkdir()
    other.mkdir()
    coef = inc / "coef.h"
    coef.write_text("#define FACTOR 2.0f\n")
    old(coef)
    os.link(coef, other / "alias.h")
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    a = view(I_SRC, options=opts)
    assert view(I_SRC, options=opts).cache_hit is True
    write_same_size_keep_mtime(other / "alias.h", "#define FACTOR 9.0f\n")
    b = view(I_SRC, options=opts)
    assert b.cache_hit is False and b.code != a.code


def test_quoted_include_next_to_a_source_named_by_path(view, tmp_path, monkeypatch):
    """`name` with a directory: its "quoted" includes are found there (kjit compile passes
    the source's path); the key follows that file."""
    (tmp_path / "src").mkdir()
    hdr = tmp_path / "src" / "coef.cuh"
    hdr.write_text("#define FACTOR 2.0f\n")
    old(hdr)
    monkeypatch.chdir(tmp_path)
    src = '#include "coef.cuh"\n' + KERNEL
    a = view(src, name="src/k.cu")
    assert view(src, name="src/k.cu").cache_hit is True
    assert view(src, name="src/k.cu").cache_hit is True
    write_same_size_keep_mtime(hdr, "#define FACTOR 3.0f\n")
    b = view(src, name="src/k.cu")
    assert b.cache_hit is False and b.code != a.code


# --- change notification -------------------------------------------------------------------
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux-only")


@linux_only
def test_quiet_repeat_does_not_stat_the_headers(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "coef.h").write_text("#define FACTOR 2.0f\n")
    old(inc / "coef.h")
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    kjit.compile(I_SRC, arch="sm_90", options=opts)
    kjit.compile(I_SRC, arch="sm_90", options=opts)        # the first repeat stats
    kjit.compile(I_SRC, arch="sm_90", options=opts)        # the second arms the watches
    calls = []
    real = Snapshot.check
    monkeypatch.setattr(Snapshot, "check", lambda self: calls.append(1) or real(self))
    for _ in range(5):
        assert kjit.compile(I_SRC, arch="sm_90", options=opts).cache_hit is True
    assert calls == []
    (inc / "coef.h").touch()                               # reported: one stat check, a hit
    assert kjit.compile(I_SRC, arch="sm_90", options=opts).cache_hit is True
    assert len(calls) == 1


@linux_only
def test_forked_child_does_not_steal_the_parents_reports(tmp_path):
    """A child shares the parent's inotify descriptor: if it read the queue, the parent
    would never see a change the child made. The child gets its own after fork."""
    inc = tmp_path / "inc"
    inc.mkdir()
    coef = inc / "coef.h"
    coef.write_text("#define FACTOR 2.0f\n")
    old(coef)
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    a = kjit.compile(I_SRC, arch="sm_90", options=opts)
    kjit.compile(I_SRC, arch="sm_90", options=opts)
    kjit.compile(I_SRC, arch="sm_90", options=opts)        # armed
    pid = os.fork()
    if pid == 0:  # child: change the header, then compile (reading whatever queue it has)
        code = 1
        try:
            write_same_size_keep_mtime(coef, "#define FACTOR 3.0f\n")
            obj = kjit.compile(I_SRC, arch="sm_90", options=opts)
            code = 0 if obj.code != a.code else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    b = kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert b.code != a.code


# --- manifests (what a new process uses) ---------------------------------------------------
def _manifests() -> list[Path]:
    return sorted(Path(os.environ["KJIT_CACHE_DIR"], manifest.DIR_NAME).glob("*/*.json"))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty"])
def test_damaged_manifest_is_a_miss_never_an_error(tmp_path, damage):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "coef.h").write_text("#define FACTOR 2.0f\n")
    old(inc / "coef.h")
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    a = kjit.compile(I_SRC, arch="sm_90", options=opts)
    [m] = _manifests()
    data = m.read_bytes()
    m.write_bytes({"garbage": b"\x00\xff{nope", "truncated": data[: len(data) // 2],
                   "flipped": data.replace(b"\"key\":\"", b"\"key\":\"0", 1), "empty": b""}[damage])
    compiled._memo.clear()
    lookup.current().memory.clear()
    b = kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert b.cache_hit is True and b.code == a.code


def test_fresh_process_hit_reads_no_header_and_no_pathfinder(tmp_path):
    """A new process keys a CUB + cooperative groups + fp16 kernel from its manifest: it
    neither resolves includes nor imports cuda.pathfinder (~60 ms)."""
    src = (REPO / "tests" / "corpus" / "cg_warp_reduce.cu").read_text()
    src = "#include <cuda_fp16.h>\n#include <cub/block/block_reduce.cuh>\n" + src
    (tmp_path / "k.cu").write_text(src)
    script = textwrap.dedent(f"""
        import sys
        import kjit
        from kjit.compiler.keys import includes
        if sys.argv[1] == "second":
            def no(*a, **k): raise AssertionError("resolved includes on a manifest hit")
            includes.resolve = no
        obj = kjit.compile(open({str(tmp_path / 'k.cu')!r}).read(), arch="sm_90")
        if sys.argv[1] == "second":
            assert obj.cache_hit is True, obj.cache_hit
            assert "cuda.pathfinder" not in sys.modules
        print("OK")
    """)
    for which in ("first", "second"):
        res = subprocess.run([sys.executable, "-c", script, which], capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))), timeout=120)
        assert res.returncode == 0 and "OK" in res.stdout, res.stderr


def test_fresh_process_sees_in_place_rewrite_with_mtime_restored(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    coef = inc / "coef.h"
    coef.write_text("#define FACTOR 2.0f\n")
    old(coef)
    script = textwrap.dedent(f"""
        import kjit
        obj = kjit.compile({I_SRC!r}, arch="sm_90",
                           options=kjit.CompileOptions(include_dirs=[{str(inc)!r}]))
        print(obj.cache_hit, obj.code.hex()[:0] + str(hash(obj.code)))
    """)

    def run():
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), PYTHONHASHSEED="0"),
                             timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout.split()
    hit0, code0 = run()
    assert (hit0, run()[0]) == ("False", "True")
    write_same_size_keep_mtime(coef, "#define FACTOR 3.0f\n")
    hit1, code1 = run()
    assert hit1 == "False" and code1 != code0


def test_cache_clear_removes_manifests(tmp_path):
    from kjit.cache import admin as ops
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "coef.h").write_text("#define FACTOR 2.0f\n")
    kjit.compile(I_SRC, arch="sm_90", options=kjit.CompileOptions(include_dirs=[str(inc)]))
    assert _manifests()
    ops.clear()
    assert _manifests() == []


# --- a header changed while NVRTC compiled ---------------------------------------------------
def test_header_edited_during_the_compile_is_never_keyed_as_the_old_one(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    inc.mkdir()
    coef = inc / "coef.h"
    coef.write_text("#define FACTOR 2.0f\n")
    old(coef)
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    real = compiled.compile_uncached
    edits = []

    def compile_while_someone_edits(req, *args):
        if not edits:
            edits.append(1)
            write_same_size_keep_mtime(coef, "#define FACTOR 3.0f\n")
        return real(req, *args)
    monkeypatch.setattr(compiled, "compile_uncached", compile_while_someone_edits)
    three = kjit.compile(I_SRC, arch="sm_90", options=opts)
    monkeypatch.setattr(compiled, "compile_uncached", real)
    write_same_size_keep_mtime(coef, "#define FACTOR 2.0f\n")       # back to the keyed content
    two = kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert two.cache_hit is False and two.code != three.code         # not three's binary
    write_same_size_keep_mtime(coef, "#define FACTOR 3.0f\n")
    assert kjit.compile(I_SRC, arch="sm_90", options=opts).code == three.code


def test_relative_include_flag_in_extra_follows_the_current_directory(tmp_path, monkeypatch):
    for d, val in (("one", "2.0f"), ("two", "3.0f")):
        (tmp_path / d / "inc").mkdir(parents=True)
        (tmp_path / d / "inc" / "coef.h").write_text(f"#define FACTOR {val}\n")
    opts = kjit.CompileOptions(extra=["-Iinc"])
    monkeypatch.chdir(tmp_path / "one")
    a = kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert kjit.compile(I_SRC, arch="sm_90", options=opts).cache_hit is True
    monkeypatch.chdir(tmp_path / "two")
    b = kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert b.cache_hit is False and b.code != a.code


def test_manifest_goes_to_the_next_listed_cache_dir_when_the_first_cannot_take_it(
        tmp_path, monkeypatch):
    first, second = tmp_path / "baked", tmp_path / "mine"
    first.mkdir()
    (first / manifest.DIR_NAME).write_text("not a directory")     # the first refuses the write
    monkeypatch.setenv("KJIT_CACHE_DIR", f"{first}{os.pathsep}{second}")
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "coef.h").write_text("#define FACTOR 2.0f\n")
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    kjit.compile(I_SRC, arch="sm_90", options=opts)
    assert list((second / manifest.DIR_NAME).glob("*/*.json"))
    compiled._memo.clear()
    calls = []
    real = includes.resolve
    monkeypatch.setattr(includes, "resolve", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert kjit.compile(I_SRC, arch="sm_90", options=opts).cache_hit is True
    assert calls == []                                               # keyed from the manifest
