"""Issue 40, stale binaries from what the observer did not see and from the scanner's guesses.
Each test edits what a compile read (a header, an environment variable) and checks that the
binary follows it, in a fresh process where the manifest on disk decides (CPU: NVRTC needs
no GPU)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import kjit
from kjit.cache import CacheWarning
from kjit.compiler import cached as compiled
from kjit.compiler.keys import observe
from kjit.errors import InvalidOptionError
from observe_helpers import KERNEL, edit_and_check, ptx, val, write

REPO = Path(__file__).resolve().parents[1]
observed = pytest.mark.skipif(not observe.available(), reason="the compile observer is not built")

FRESH = textwrap.dedent("""
    import hashlib, json, re, sys, warnings
    import kjit
    args = json.loads(sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = kjit.compile(args["src"], arch=args["arch"], target=args["target"],
                         options=kjit.CompileOptions(**args["opts"]))
        fresh = kjit.compile(args["src"], arch=args["arch"], target=args["target"],
                             options=kjit.CompileOptions(**args["opts"]), cache=False)
    m = re.search(rb"mov\\.u32\\s+%r\\d+,\\s*(\\d+);", o.code) if args["target"] == "ptx" else None
    print(json.dumps({"hit": o.cache_hit, "val": int(m.group(1)) if m else None,
                      "sha": hashlib.sha256(o.code).hexdigest(),
                      "fresh": hashlib.sha256(fresh.code).hexdigest(),
                      "warnings": [str(w.message) for w in caught]}))
""")


def fresh_process(src: str, *, arch: str = "sm_80", target: str = "ptx", opts: dict | None = None,
                  env: dict | None = None, cwd: str | None = None) -> dict:
    """Compile in a new process (the cache directory this test's): the binary it got, and
    the one a compile without the cache makes there."""
    import json
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for k, v in (env or {}).items():
        if v is None:
            environ.pop(k, None)
        else:
            environ[k] = v
    out = subprocess.run([sys.executable, "-c", FRESH, json.dumps(
        {"src": src, "arch": arch, "target": target, "opts": opts or {}})],
        env=environ, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def follows_across_processes(src: str, header: Path, **kw) -> None:
    """Fresh processes: stored, found, then the header edited and the new constant compiled."""
    write(header, "#define VAL 1111111\n")
    first = fresh_process(src, **kw)
    assert first["val"] == 1111111 and first["hit"] is False
    assert fresh_process(src, **kw)["hit"] is True
    write(header, "#define VAL 2222222\n")
    second = fresh_process(src, **kw)
    assert second["val"] == 2222222, second
    assert second["sha"] == second["fresh"]


# --- 1. the observer keys every file the compiler read, wherever it lies ---------------------------
@observed
def test_a_header_under_dev_shm_is_keyed(tmp_path):
    """Generators write headers to /dev/shm (tmpfs): a file like any other."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("/dev/shm is not writable here")
    d = Path("/dev/shm") / f"kjit-test-{os.getpid()}-{tmp_path.name}"
    try:
        src = f'#include "{d}/gen.h"\n' + KERNEL
        follows_across_processes(src, d / "gen.h")
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


@observed
def test_a_header_through_proc_self_cwd_is_keyed(tmp_path):
    src = '#include "/proc/self/cwd/a.h"\n' + KERNEL
    follows_across_processes(src, tmp_path / "a.h", cwd=str(tmp_path))


@observed
def test_a_header_through_proc_self_cwd_is_keyed_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    edit_and_check('#include "/proc/self/cwd/a.h"\n' + KERNEL, tmp_path / "a.h")


@observed
def test_headers_of_a_compile_with_a_time_trace_under_tmpdir_are_keyed(tmp_path):
    """NVRTC writes the trace: what it wrote is its output, the headers beside it are still
    inputs (every header below the trace's directory under $TMPDIR was dropped)."""
    work = tmp_path / "build"
    trace = work / "trace"   # no .json: NVRTC adds it (NVRTC 12 fails a name with it)
    src = '#include "a.h"\n' + KERNEL
    opts = {"include_dirs": [str(work / "inc")], "extra": [f"--fdevice-time-trace={trace}"]}
    probe = tmp_path / "probe"
    try:   # NVRTC 13.0's ptxas fails reading a trace file an earlier compile wrote
        for value in ("3", "4"):
            kjit.compile(KERNEL.replace("VAL", value), arch="sm_90", cache=False,
                         options=kjit.CompileOptions(extra=[f"--fdevice-time-trace={probe}"]))
    except kjit.CompileError as exc:
        if "trace file" in str(exc):
            pytest.skip("this NVRTC fails its own --fdevice-time-trace (NVRTC 13.0's ptxas)")
        raise
    follows_across_processes(src, work / "inc" / "a.h", opts=opts, env={"TMPDIR": str(tmp_path)})


@observed
def test_the_time_trace_file_itself_does_not_keep_a_compile_from_the_cache(tmp_path):
    """The trace NVRTC writes and reads back is its output, not an input that changed."""
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1111111\n")
    # no .json: NVRTC adds it (NVRTC 12 fails a name with it)
    opts = dict(include_dirs=[str(inc)], extra=[f"--fdevice-time-trace={tmp_path / 't'}"])
    src = '#include "a.h"\n' + KERNEL
    assert ptx(src, **opts).cache_hit is False
    compiled._memo.clear()
    assert ptx(src, **opts).cache_hit is True


@observed
def test_kernel_state_read_as_a_header_is_returned_not_stored(tmp_path, monkeypatch):
    """/proc/sys/kernel/ns_last_pid is valid C and changes with every new process: no stat
    describes it, so the compile is returned, never stored, and kjit says why once."""
    state = "/proc/sys/kernel/ns_last_pid"
    if not os.access(state, os.R_OK):
        pytest.skip(f"{state} is not readable here")
    from kjit.compiler.keys import description as key
    monkeypatch.setattr(key, "_warned", set(), raising=False)
    src = f'extern "C" __global__ void k(int* p) {{ *p =\n#include "{state}"\n; }}\n'
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = ptx(src)
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # a new process: a new pid
        second = ptx(src)
    assert val(second) != val(first)                            # not the first one's binary
    assert first.cache_hit is None and second.cache_hit is None
    said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(said) == 1 and "ns_last_pid" in said[0] and "kernel state" in said[0]
    assert fresh_process(src)["hit"] is None


def test_special_files_and_kernel_state_leave_an_observation_unkeyed(tmp_path):
    """The classification on its own (NVRTC itself refuses a FIFO as a header; hiprtc's clang
    reads one): a device, FIFO or socket, or a /proc file read, cannot be keyed; /dev/shm
    and paths through /proc/self/cwd name files that can."""
    fifo = tmp_path / "fifo.h"
    os.mkfifo(fifo)
    (tmp_path / "a.h").write_text("x")
    st = os.stat(tmp_path / "a.h")
    sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def rec(op, kind, path, s=(0, 0, 0, 0, 0)):
        return (op, kind, path, *s)
    base = [rec("s", observe.K_ABSENT, str(tmp_path / "k.cu"))]
    special = observe.classify(base + [rec("s", observe.K_SPECIAL, str(fifo))], source_name="k.cu")
    assert special.unkeyable and "FIFO" in special.unkeyable
    state = observe.classify(base + [rec("o", observe.K_FILE, "/proc/sys/kernel/pid_max")],
                             source_name="k.cu")
    assert state.unkeyable and "kernel state" in state.unkeyable
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        through = observe.classify(base + [rec("o", observe.K_FILE, "/proc/self/cwd/a.h", sig)],
                                   source_name="k.cu")
    finally:
        os.chdir(cwd)
    assert through.unkeyable is None and list(through.read) == [str(tmp_path / "a.h")]
    assert through.cwd_dependent


# --- 2. the environment variables NVRTC reads ------------------------------------------------------
@observed
@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_finalizer_elf_builder_variable_is_keyed_across_processes(tmp_path, arch):
    """FINALIZER_USE_LEGACY_ELF_BUILDER changes the cubin's bytes (NVRTC 13, sm_90 and later):
    a process that sets it must not get the binary of one that did not."""
    src = KERNEL.replace("VAL", "7") + f"// {tmp_path.name}\n"
    var = "FINALIZER_USE_LEGACY_ELF_BUILDER"
    plain = fresh_process(src, arch=arch, target="cubin", env={var: None})
    legacy = fresh_process(src, arch=arch, target="cubin", env={var: "1"})
    if plain["fresh"] == legacy["fresh"]:
        pytest.skip(f"{var} does not change this NVRTC's {arch} cubin")
    assert legacy["sha"] == legacy["fresh"] and legacy["hit"] is False
    assert fresh_process(src, arch=arch, target="cubin", env={var: "1"})["hit"] is True
    again = fresh_process(src, arch=arch, target="cubin", env={var: None})
    assert again["hit"] is True and again["sha"] == plain["fresh"]


@observed
def test_finalizer_elf_builder_variable_set_in_process(tmp_path, monkeypatch):
    """Set between two calls of one process: the remembered key must not answer."""
    var = "FINALIZER_USE_LEGACY_ELF_BUILDER"
    monkeypatch.delenv(var, raising=False)
    src = KERNEL.replace("VAL", "8") + f"// {tmp_path.name}\n"

    def cubin(**kw):
        return kjit.compile(src, arch="sm_90", target="cubin", **kw)
    plain = cubin()
    assert cubin().cache_hit is True and cubin().cache_hit is True   # watched from here on
    monkeypatch.setenv(var, "1")
    legacy = cubin()
    fresh = cubin(cache=False)
    if fresh.code == plain.code:
        pytest.skip(f"{var} does not change this NVRTC's sm_90 cubin")
    assert legacy.code == fresh.code and legacy.cache_hit is False
    monkeypatch.delenv(var)
    assert cubin().code == plain.code


@observed
def test_llvm_override_producer_is_keyed_across_processes(tmp_path):
    """NVRTC reads LLVM_OVERRIDE_PRODUCER as it loads (before any hook): it changes LTO-IR."""
    src = KERNEL.replace("VAL", "9") + f"// {tmp_path.name}\n"
    var = "LLVM_OVERRIDE_PRODUCER"
    plain = fresh_process(src, target="ltoir", env={var: None})
    other = fresh_process(src, target="ltoir", env={var: "kjit-test"})
    if plain["fresh"] == other["fresh"]:
        pytest.skip(f"{var} does not change this NVRTC's LTO-IR")
    assert other["sha"] == other["fresh"] and other["hit"] is False
    assert fresh_process(src, target="ltoir", env={var: None})["sha"] == plain["fresh"]


@observed
@pytest.mark.parametrize("var,value", [("PWD", "/elsewhere"), ("MAKEFLAGS", " -j8 --jobserver-auth=3,4")])
def test_variables_read_but_not_keyed_do_not_change_the_output(tmp_path, var, value):
    """NVRTC reads PWD and MAKEFLAGS; kjit does not key them (every working directory and
    make run would be an entry of its own), because they do not change NVRTC's output, even
    with debug information. Should an NVRTC start using them, this fails."""
    src = KERNEL.replace("VAL", "10") + f"// {tmp_path.name}\n"
    for target, extra in (("cubin", ["-G"]), ("ltoir", []), ("ptx", ["-lineinfo"])):
        opts = {"extra": extra}
        a = fresh_process(src, arch="sm_90", target=target, opts=opts, env={var: None})
        b = fresh_process(src, arch="sm_90", target=target, opts=opts, env={var: value})
        if a["fresh"] != b["fresh"] and any(
                fresh_process(src, arch="sm_90", target=target, opts=opts, env={var: None})["fresh"]
                != a["fresh"] for _ in range(3)):
            continue   # this NVRTC's output differs from run to run (CUDA 12's -G cubin): nothing to tell
        assert a["fresh"] == b["fresh"], (target, extra)


@observed
def test_the_variables_nvrtc_reads_are_recorded():
    """The getenv hook sees NVRTC's reads (its finalizer's on an sm_90 cubin)."""
    src = KERNEL.replace("VAL", "11")
    with observe.collecting() as seen:
        compiled.compile_uncached(compiled.make_request(src, arch="sm_90", target="cubin"))
    from kjit.compiler.nvrtc import version
    assert seen[0].env, "no getenv of NVRTC's was seen"
    if version() >= (13, 5):   # NVRTC 13.0's finalizer does not read it
        assert "FINALIZER_USE_LEGACY_ELF_BUILDER" in seen[0].env
    assert "PWD" not in seen[0].env


# --- 3. NVRTC's own precompiled headers ------------------------------------------------------------
@pytest.mark.parametrize("flags", [
    ["--pch"], ["-pch"], ["--pch-dir=/tmp/x"], ["--pch-dir", "/tmp/x"], ["-pch-dir /tmp/x"],
    ["--create-pch=a.pch"], ["-create-pch", "a.pch"], ["--use-pch=a.pch"], ["-use-pch=a.pch"],
])
def test_nvrtcs_own_pch_flags_are_refused(flags):
    """NVRTC's automatic PCH (--pch --pch-dir) gave stale results within one process: it
    keeps state the cache cannot key. kjit makes precompiled headers itself (KJIT_PCH)."""
    with pytest.raises(InvalidOptionError, match="KJIT_PCH") as err:
        kjit.CompileOptions(extra=flags)
    assert flags[0] in str(err.value)


# --- 4. without the observer, nothing is guessed ---------------------------------------------------
# The cases the scanner (compiler/keys/includes.py) keyed wrongly in round 2 (tests/test_observe.py
# holds them for the observer).
CASES = {
    "macro-under-if": ('#if 1\n#define HDR "b.h"\n#else\n#define HDR "a.h"\n#endif\n#include HDR\n', {}),
    "digraph": ('%:include "b.h"\n', {}),
    "comment-in-directive": ('#include /*x*/ "b.h"\n', {}),
    "split-I-flag": ('#include "b.h"\n', {"split": True}),
    "symlink-dotdot": ('#include "sub/../b.h"\n', {"link": True}),
    "has-include-macro": ('#define OPT "opt.h"\n#if __has_include(OPT)\n#include "b.h"\n#else\n'
                          '#define VAL 9999999\n#endif\n', {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_without_the_observer_header_compiles_are_never_stale(tmp_path, monkeypatch, case):
    monkeypatch.setenv("KJIT_OBSERVE", "0")
    monkeypatch.setattr(compiled, "_warned", set())
    prologue, how = CASES[case]
    inc = tmp_path / "inc"
    header = inc / "b.h"
    write(inc / "a.h", "#define VAL 9999999\n")                 # the scanner's wrong guess
    opts: dict = {"include_dirs": [str(inc)]}
    if how.get("split"):
        opts = {"extra": ["-I", str(inc)]}
    if how.get("link"):                                         # sub/.. is elsewhere, not inc
        elsewhere = tmp_path / "elsewhere"
        (elsewhere / "deep").mkdir(parents=True)
        (inc / "sub").symlink_to(elsewhere / "deep")
        header = elsewhere / "b.h"
    if case == "has-include-macro":
        write(inc / "opt.h", "\n")
    src = prologue + KERNEL
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = []
        for value in (1111111, 2222222, 1111111):
            write(header, f"#define VAL {value}\n")
            obj = ptx(src, **opts)
            got.append((val(obj), obj.cache_hit))
    assert [v for v, _ in got] == [1111111, 2222222, 1111111]     # never the old binary
    assert [h for _, h in got] == [None] * 3                    # returned, not stored
    said = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(said) == 1 and "KJIT_OBSERVE=0" in str(said[0].message)
    if case == "has-include-macro":
        (inc / "opt.h").unlink()
        assert val(ptx(src, **opts)) == 9999999


def test_without_the_observer_a_fresh_process_gets_no_stale_binary(tmp_path):
    inc = tmp_path / "inc"
    src = '#define HDR "b.h"\n#include HDR\n' + KERNEL
    write(inc / "b.h", "#define VAL 1111111\n")
    env = {"KJIT_OBSERVE": "0"}
    first = fresh_process(src, opts={"include_dirs": [str(inc)]}, env=env)
    assert first["val"] == 1111111 and first["hit"] is None
    assert any("not cache compiles that may read headers" in w for w in first["warnings"])
    write(inc / "b.h", "#define VAL 2222222\n")
    assert fresh_process(src, opts={"include_dirs": [str(inc)]}, env=env)["val"] == 2222222


def test_without_the_observer_a_source_without_headers_is_still_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KJIT_OBSERVE", "0")
    src = KERNEL.replace("VAL", "4444444") + f"// {tmp_path.name}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)           # nothing to say
        assert ptx(src).cache_hit is False
        compiled._memo.clear()
        assert ptx(src).cache_hit is True


@pytest.mark.parametrize("opts", [
    {"include_dirs": ["."]}, {"headers": {"h.h": "#define X 1\n"}}, {"extra": ["-I."]},
    {"extra": ["--pre-include", "x.h"]}, {"extra": ["-include", "x.h"]},
], ids=["include_dirs", "headers", "-I", "--pre-include", "-include"])
def test_header_options_make_a_compile_header_dependent(opts):
    from kjit.compiler.keys import includes
    assert includes.header_dependent(KERNEL, kjit.CompileOptions(**opts)) is not None
    assert includes.header_dependent(KERNEL, kjit.CompileOptions()) is None
    assert includes.header_dependent("// #  include <x>\n" + KERNEL, kjit.CompileOptions())
