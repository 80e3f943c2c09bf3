"""Precompiled headers (kjit/compiler/pch.py): a process's second compile of a source with the
same include prologue starts from a PCH, with the same binary, log and key as without one,
never from a PCH whose headers changed; failures and refusals fall back, counted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kjit
from kjit.compiler import cached, pch, pch_files
from kjit.compiler.keys import observe

ROOT = Path(__file__).resolve().parent.parent

# a PCH's files are known only by observing its compile: without the observer, no PCH is made
pytestmark = pytest.mark.skipif(not observe.available("cuda"),
                                reason="the compile observer (kjit/compiler/keys/_observe.c) is not "
                                       "built here: precompiled headers are off without it")

HEADER = textwrap.dedent("""\
    #pragma once
    template <class T> __device__ T twice(T x) {{ return x + x; }}
    #define K {k}
    """)


def source(i: int) -> str:
    """The prologue (in the PCH), then a declaration, then an include the PCH does not hold."""
    return ('// a kernel\n#include "h.h"\n#include <cuda/std/cstdint>\n\n'
            '__device__ float late();\n#include "g.h"\n'
            f'extern "C" __global__ void k(float* x) {{ x[0] = twice(x[0]) + K + late() + {i}.5f; }}\n')


@pytest.fixture
def inc(tmp_path: Path) -> Path:
    d = tmp_path / "inc"
    d.mkdir()
    (d / "h.h").write_text(HEADER.format(k=3))
    (d / "g.h").write_text("__device__ float late() { return 2.0f; }\n")
    return d


def _compile(i: int, inc: Path, **kw):
    kw.setdefault("arch", "sm_90")
    return kjit.compile(source(i), options=kjit.CompileOptions(include_dirs=[str(inc)],
                                                               **kw.pop("opts", {})), **kw)


def _plain(i: int, inc: Path, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv("KJIT_PCH", "0")
        return _compile(i, inc, cache=False, **kw)


def _delta(before: dict) -> dict:
    """What the counts gained (not "evicted": earlier tests' PCHs make room for this one's)."""
    return {k: v - before[k] for k, v in pch.stats().items() if v != before[k] and k != "evicted"}


def test_prologue_ends_after_the_leading_directives():
    assert pch.prologue(source(1)) == '// a kernel\n#include "h.h"\n#include <cuda/std/cstdint>\n'
    assert pch.prologue('#include "a.h"\n/* x\n */ # define A 1\nint x;\n') == \
        '#include "a.h"\n/* x\n */ # define A 1\n'
    assert pch.prologue("#define A 1\nint x;\n") is None           # includes nothing
    assert pch.prologue('#ifdef A\n#include "a.h"\nint x;\n#endif\n') is None  # stops in an #if
    assert pch.prologue('#include "a.h"\nint y; \n#include "b.h"\n') == '#include "a.h"\n'


@pytest.mark.parametrize("target", ["cubin", "ptx", "ltoir"])
def test_second_compile_uses_a_pch_and_gets_the_same_binary(inc, monkeypatch, target):
    before = pch.stats()
    first = _compile(1, inc, target=target)
    assert "pch" not in first.metadata                    # one compile: no PCH built
    second = _compile(2, inc, target=target)
    third = _compile(3, inc, target=target)
    assert (second.metadata["pch"], third.metadata["pch"]) == ("created", "used")
    assert _delta(before) == {"created": 1, "used": 2}
    for i, obj in ((2, second), (3, third)):
        plain = _plain(i, inc, monkeypatch, target=target)
        assert "pch" not in plain.metadata
        assert obj.code == plain.code and obj.log == plain.log == ""


def test_name_expressions_and_compile_errors_are_those_of_a_plain_compile(inc, monkeypatch):
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    tmpl = ('#include "h.h"\n#include <cuda/std/cstdint>\n'
            'template <class T> __global__ void t(T* x) {{ x[0] = twice(x[0]) + {}; }}\n')
    objs = [kjit.compile(tmpl.format(i), arch="sm_90", options=opts, target="ptx",
                         name_expressions=["t<float>", "t<int>"]) for i in (1, 2)]
    bad = tmpl.format("undeclared_thing")
    before = pch.stats()
    with pytest.raises(kjit.CompileError) as used:
        kjit.compile(bad, arch="sm_90", options=opts, name_expressions=["t<float>"])
    assert _delta(before) == {"used": 1}
    assert objs[1].metadata["pch"] == "created"
    monkeypatch.setenv("KJIT_PCH", "0")
    plain = kjit.compile(tmpl.format(2), arch="sm_90", options=opts, target="ptx",
                         name_expressions=["t<float>", "t<int>"], cache=False)
    assert (objs[1].code, dict(objs[1].symbols)) == (plain.code, dict(plain.symbols))
    with pytest.raises(kjit.CompileError) as without:
        kjit.compile(bad, arch="sm_90", options=opts, name_expressions=["t<float>"], cache=False)
    assert "undeclared_thing" in used.value.log and used.value.log == without.value.log


def test_a_time_trace_flag_turns_it_off(inc, tmp_path):
    trace = tmp_path / "trace"   # no .json: NVRTC adds it (NVRTC 12 fails a name with it)
    before = pch.stats()
    for i in (1, 2, 3):
        try:
            obj = _compile(i, inc, opts={"extra": [f"--fdevice-time-trace={trace}"]})
        except kjit.CompileError as exc:   # NVRTC 13.0's ptxas cannot always read its own trace
            if "trace file" not in str(exc):
                raise
            pytest.skip(f"this NVRTC fails --fdevice-time-trace itself: {str(exc).splitlines()[2:3]}")
        assert "pch" not in obj.metadata
    assert pch.stats() == before


def test_observed_key_is_the_same_with_and_without_a_pch(inc, monkeypatch, tmp_path):
    _compile(1, inc)
    used = _compile(2, inc)
    assert used.metadata["pch"] == "created"
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    with_pch = cached.compile_key(source(2), arch="sm_90", options=opts)   # from its manifest
    monkeypatch.setenv("KJIT_PCH", "0")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "other-cache"))
    before = pch.stats()
    without = cached.compile_key(source(2), arch="sm_90", options=opts)   # compiled, observed
    assert pch.stats() == before
    assert with_pch == without


def test_different_defines_or_arch_never_use_anothers_pch(inc, monkeypatch):
    _compile(1, inc)
    _compile(2, inc)                                       # a PCH for sm_90, no defines
    before = pch.stats()
    other_arch = _compile(3, inc, arch="sm_80")
    defined = _compile(4, inc, opts={"defines": {"EXTRA": "1"}})
    assert "pch" not in other_arch.metadata and "pch" not in defined.metadata
    assert _delta(before) == {}
    assert other_arch.code == _plain(3, inc, monkeypatch, arch="sm_80").code
    assert defined.code == _plain(4, inc, monkeypatch, opts={"defines": {"EXTRA": "1"}}).code


def test_header_edited_between_compiles_gives_the_new_binary(inc, monkeypatch):
    _compile(1, inc, target="ptx")
    assert _compile(2, inc, target="ptx").metadata["pch"] == "created"
    (inc / "h.h").write_text(HEADER.format(k=7))          # NVRTC itself would use the old PCH
    before = pch.stats()
    edited = _compile(3, inc, target="ptx")
    assert edited.metadata["pch"] == "created"            # built again from the new header
    assert _delta(before) == {"stale": 1, "created": 1, "used": 1}
    plain = _plain(3, inc, monkeypatch, target="ptx")
    assert edited.code == plain.code
    (inc / "h.h").write_text(HEADER.format(k=3))
    assert _compile(3, inc, target="ptx").code != edited.code
    (inc / "g.h").write_text("__device__ float late() { return 5.0f; }\n")  # read after the PCH
    late = _compile(3, inc, target="ptx")
    assert late.metadata["pch"] == "used" and late.code == _plain(3, inc, monkeypatch, target="ptx").code


def test_a_refused_pch_falls_back_to_a_plain_compile(inc, monkeypatch):
    _compile(1, inc)
    _compile(2, inc)
    pch_file = max(map(Path, pch.files()), key=lambda p: p.stat().st_mtime_ns)  # this one
    pch_file.write_bytes(b"not a precompiled header" * 100)
    # taken as the file it wrote (a changed file is never given to NVRTC: test_pch_faults.py)
    monkeypatch.setattr(pch._Pch, "intact", lambda self: True)
    before = pch.stats()
    obj = _compile(3, inc)
    assert _delta(before) == {"rejected": 1}
    assert "pch" not in obj.metadata and obj.log == ""
    assert obj.code == _plain(3, inc, monkeypatch).code
    assert "pch" not in _compile(4, inc).metadata         # that prologue is not tried again


@pytest.mark.parametrize("why", ["a header warns", "the source forbids it"])
def test_a_pch_that_cannot_be_built_is_counted_and_the_compile_goes_on(inc, monkeypatch, why):
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    if why == "a header warns":  # later compiles from the PCH would not repeat the warning
        (inc / "h.h").write_text(HEADER.format(k=3) + '#warning "careful"\n')
        srcs = [source(i) for i in (1, 2, 3)]
    else:
        srcs = [source(i).replace('"h.h"\n', '"h.h"\n#pragma nv_no_pch\n') for i in (1, 2, 3)]
    before = pch.stats()
    objs = [kjit.compile(s, arch="sm_90", options=opts) for s in srcs]
    assert _delta(before) == {"failed": 1}
    monkeypatch.setenv("KJIT_PCH", "0")
    for s, obj in zip(srcs, objs):
        plain = kjit.compile(s, arch="sm_90", options=opts, cache=False)
        assert "pch" not in obj.metadata and (obj.code, obj.log) == (plain.code, plain.log)
    if why == "a header warns":
        assert "careful" in objs[2].log


def test_prologues_taking_turns_do_not_rebuild_their_pchs_at_every_turn(inc, monkeypatch):
    monkeypatch.setenv("KJIT_CACHE", "0")   # a process's own PCHs (the cache's: its size cap)
    def src(p: str, i: int) -> str:
        return source(i).replace('"h.h"\n', f'"h.h"\n#define PROLOGUE_{p}\n')
    before = pch.stats()
    objs = {(p, i): kjit.compile(
        src(p, i), arch="sm_90", options=kjit.CompileOptions(include_dirs=[str(inc)]))
        for i in (1, 2, 3) for p in "ABC"}
    got = pch.stats()
    assert got["created"] - before["created"] == 3 and got["evicted"] - before["evicted"] >= 1
    assert [objs[p, 2].metadata.get("pch") for p in "ABC"] == ["created"] * 3
    assert "pch" not in objs["A", 3].metadata                # its PCH made room for C's
    assert [objs[p, 3].metadata.get("pch") for p in "BC"] == ["used"] * 2


def test_bindings_without_the_pch_calls_turn_it_off_for_the_process(inc, monkeypatch):
    from cuda.bindings import nvrtc
    monkeypatch.delattr(nvrtc, "nvrtcGetPCHCreateStatus")
    monkeypatch.setitem(pch._state, "off", None)
    before = pch.stats()
    objs = [_compile(i, inc) for i in (1, 2, 3, 4)]
    assert _delta(before) == {"failed": 1}                 # tried once, then never again
    assert pch._state["off"] and not any("pch" in o.metadata for o in objs)
    monkeypatch.setitem(pch._state, "off", None)


def test_off_switch(inc, monkeypatch):
    monkeypatch.setenv("KJIT_PCH", "0")
    before = pch.stats()
    objs = [_compile(i, inc) for i in (1, 2, 3)]
    assert pch.stats() == before and not any("pch" in o.metadata for o in objs)


def test_bad_switch_value_is_a_setting_error(monkeypatch):
    from kjit.settings import SettingError, check_settings
    monkeypatch.setenv("KJIT_PCH", "maybe")
    with pytest.raises(SettingError, match="KJIT_PCH"):
        check_settings()


def test_compile_many_worker_builds_its_pch_at_the_first_of_many(inc):
    with pch_env_jobs(2):
        objs = kjit.compile_many([source(i) for i in range(8)], arch="sm_90",
                                 options=kjit.CompileOptions(include_dirs=[str(inc)]),
                                 progress=False)
    kinds = [o.metadata.get("pch") for o in objs]
    # each worker's first compile builds it, or uses the one the other worker stored first
    assert 1 <= kinds.count("created") <= 2 and None not in kinds, kinds


def test_compile_many_sends_a_prologues_sources_together(inc):
    def src(p: str, i: int) -> str:
        return source(i).replace('"h.h"\n', f'"h.h"\n#define PROLOGUE_{p}\n')
    with pch_env_jobs(2):   # three prologues taking turns, more than a worker keeps
        objs = kjit.compile_many([src(p, i) for i in range(6) for p in "ABC"], arch="sm_90",
                                 options=kjit.CompileOptions(include_dirs=[str(inc)]),
                                 progress=False)
    kinds = [o.metadata.get("pch") for o in objs]
    assert None not in kinds and 3 <= kinds.count("created") <= 6, kinds


class pch_env_jobs:
    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.saved = os.environ.get("KJIT_COMPILE_JOBS")
        os.environ["KJIT_COMPILE_JOBS"] = str(self.n)

    def __exit__(self, *exc):
        from kjit.compiler import pool
        pool.shared_pool().close()
        if self.saved is None:
            os.environ.pop("KJIT_COMPILE_JOBS", None)
        else:
            os.environ["KJIT_COMPILE_JOBS"] = self.saved


def test_private_directory_is_removed_at_exit(inc, tmp_path):
    code = textwrap.dedent(f"""
        import json, os, kjit
        from kjit.compiler import pch
        opts = kjit.CompileOptions(include_dirs=[{str(inc)!r}])
        objs = [kjit.compile(s, arch="sm_90", options=opts) for s in {[source(1), source(2)]!r}]
        d = pch.directory()
        print(json.dumps({{"dir": d, "files": os.listdir(d), "mode": oct(os.stat(d).st_mode & 0o777),
                          "pch": objs[1].metadata.get("pch")}}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), KJIT_CACHE_DIR=str(tmp_path / "cache"),
               KJIT_CACHE="0")   # no cache directory: the process's own PCHs
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["pch"] == "created" and seen["files"] and seen["mode"] == "0o700"
    assert not os.path.exists(seen["dir"])


def test_a_forked_child_neither_uses_nor_removes_its_parents_pchs(inc, monkeypatch):
    monkeypatch.setenv("KJIT_CACHE", "0")   # the process's own PCHs (the cache's are anyone's)
    _compile(1, inc)
    assert _compile(2, inc).metadata["pch"] == "created"
    d = pch.directory()
    pid = os.fork()
    if pid == 0:  # the child: its own compiles, its own directory, its exit removes only that
        code = 1
        try:
            obj = _compile(3, inc)
            code = 0 if "pch" not in obj.metadata and pch.directory() is None else 2
        finally:
            pch.cleanup()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.path.isdir(d) and _compile(4, inc).metadata["pch"] == "used"


def test_directory_of_a_killed_process_is_swept(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    left = tmp_path / f"kjit-pch-{dead}-x"
    left.mkdir()
    (left / "1.pch").write_bytes(b"x")
    alive = tmp_path / f"kjit-pch-{os.getpid()}-y"
    alive.mkdir()
    pch_files.sweep(str(tmp_path), "kjit-pch-")
    assert not left.exists() and alive.exists()


def test_heap_grows_to_what_nvrtc_says_it_needs(tmp_path):
    code = textwrap.dedent("""
        import json, kjit
        from cuda.bindings import nvrtc
        from kjit.compiler import pch
        pch.HEAP_MIN = 1 << 20
        nvrtc.nvrtcSetPCHHeapSize(1 << 20)     # far too small for <cuda/std/cstdint>
        src = '#include <cuda/std/cstdint>\\nextern "C" __global__ void k(int* x) {{ x[0] = {}; }}\\n'
        objs = [kjit.compile(src.format(i), arch="sm_90") for i in range(3)]
        print(json.dumps({"pch": [o.metadata.get("pch") for o in objs], "stats": pch.stats(),
                          "heap": nvrtc.nvrtcGetPCHHeapSize()[1]}))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), KJIT_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["pch"] == [None, "created", "used"]
    assert seen["stats"]["created"] == 1 and seen["stats"]["failed"] == 0
    assert seen["heap"] > 1 << 20
