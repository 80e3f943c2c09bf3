"""Hostile values end in a clear error, never exit 70 or a raise from deep inside (issue 40):
tuning records of the wrong shape, settings of 100,000 characters, names that are not UTF-8,
and running out of memory under an address-space limit."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kjit.cli.main import cli

from test_tune import CONFIGS, FakeTimer, make

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args):
    res = CliRunner().invoke(cli, [str(a) for a in args])
    return res.exit_code, res.output


def run_cli(*args, env=None, preexec_fn=None, timeout=120):
    env = dict(os.environ, **(env or {}),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "kjit.cli.main", *map(os.fsencode, map(str, args))],
                          env=env, capture_output=True, timeout=timeout, preexec_fn=preexec_fn)


# --- tuning records ----------------------------------------------------------------------------

def _plant(info_patch=None, record=None):
    """Overwrite the first tuning entry on disk: its description patched, its record
    replaced (as a shared tier or an imported archive could have written them)."""
    from kjit import ObjectCode
    from kjit.cache import admin, lookup
    rows = [r for r in admin.ls(kernel="autotune:") if r.get("namespace") == "autotune"]
    assert rows
    meta = dict(rows[0])
    if info_patch is not None:
        meta["autotune"] = info_patch(dict(meta["autotune"]))
    c = lookup.current()
    code = json.dumps(record).encode() if record is not None else c.disk.get(meta["key"])[0].code
    c.disk.put(meta["key"], ObjectCode(code, kind="json", name="planted"), meta)
    c.memory.clear()
    return meta["key"]


# name -> (how the description is changed, whether the entry is then left out of listings)
BAD_INFOS = {
    "not an object": (lambda i: ["kernel", "device"], True),
    "kernel a number": (lambda i: {**i, "kernel": 12}, True),
    "device a string": (lambda i: {**i, "device": "GPU"}, True),
    "key a list": (lambda i: {**i, "key": [1, 2]}, True),
    "config a string": (lambda i: {**i, "config": "BS=1"}, True),
    # of the right kinds, with odd contents: listed and shown as they are
    "shape a number": (lambda i: {**i, "key": {"n": {"shape": 5, "dtype": "f4"}}}, False),
    "params a list": (lambda i: {**i, "config": {"params": [1, 2], "defines": "X"}}, False),
}
BAD_RECORDS = {
    "ms a string": {"status": "ok", "ms": "fast"},
    "no ms": {"status": "ok"},
    "ms negative": {"status": "ok", "ms": -1},
    "ms a list": {"status": "ok", "ms": [1.0]},
    "reason a number": {"status": "skipped", "reason": 7},
    "reps a string": {"status": "ok", "ms": 1.0, "reps": "many"},
}


@pytest.mark.parametrize("case", BAD_INFOS)
def test_tune_ls_and_show_survive_a_description_of_any_shape(case):
    patch, left_out = BAD_INFOS[case]
    make(CONFIGS[:2], FakeTimer()).tune(None, 2.0, 4096)
    _plant(info_patch=patch)
    code, out = invoke("tune", "ls", "--json")
    assert code == 0, out
    groups = json.loads(out[out.index("["):])
    assert sum(len(g["configs"]) for g in groups) == (1 if left_out else 2)
    code, out = invoke("tune", "ls")
    assert code == 0 and ("not of the shape kjit writes" in out) == left_out, out
    for g in groups:
        code, out = invoke("tune", "show", g["id"])
        assert code == 0, out
    code, out = invoke("tune", "clear", "--json", "--yes")   # a planted entry goes too
    assert code == 0 and json.loads(out[out.index("{"):])["removed"] == 2, out


@pytest.mark.parametrize("case", BAD_RECORDS)
def test_tune_ls_and_show_survive_a_record_of_any_shape(case):
    make(CONFIGS[:2], FakeTimer()).tune(None, 2.0, 4096)
    _plant(record=BAD_RECORDS[case])
    code, out = invoke("tune", "ls", "--json")
    assert code == 0, out
    (group,) = json.loads(out)
    assert [c["result"] for c in group["configs"]].count(None) == 1
    code, out = invoke("tune", "ls")
    assert code == 0, out
    code, out = invoke("tune", "show", group["id"])
    assert code == 0 and "(unreadable)" in out, out


@pytest.mark.parametrize("case", ["ms a string", "no ms", "ms a list"])
def test_the_tuner_times_again_a_record_of_the_wrong_shape(case):
    make(CONFIGS[:2], FakeTimer()).tune(None, 2.0, 4096)
    _plant(record=BAD_RECORDS[case])
    timer = FakeTimer({64: 0.25})
    with pytest.warns(RuntimeWarning, match="not one kjit writes"):
        r = make(CONFIGS[:2], timer).tune(None, 2.0, 4096)
    assert len(timer.calls) == 1   # only the configuration whose record was planted
    assert isinstance(r.ms, float) and r.config.params in ({"BS": 64}, {"BS": 128})


# --- settings ----------------------------------------------------------------------------------

HUGE = 100_000


@pytest.mark.parametrize("name,value", [
    ("KJIT_COMPILE_JOBS", "9" * HUGE),
    ("KJIT_AUTOTUNE", "fixed:" + "9" * HUGE),
    ("KJIT_CACHE_DIR", "a" * HUGE),
    ("KJIT_CACHE_DIR", "/tmp/" + "d/" * 3000),
    ("KJIT_CACHE_DIR", "/tmp/" + "n" * 300),
])
def test_a_setting_of_100000_characters_is_a_usage_error(tmp_path, name, value):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k() {}\n')
    env = {"KJIT_CACHE_DIR": str(tmp_path / "cache"), name: value}
    res = run_cli("compile", src, "--arch", "sm_90", "-o", tmp_path / "k.cubin", "--json", env=env)
    assert res.returncode == 2, res.stderr[-3000:]
    error = json.loads(res.stdout)["error"]
    assert error["type"] == "UsageError" and name in error["message"]
    assert len(error["message"]) < 1000   # the value is named, not repeated whole
    assert b"Traceback" not in res.stderr


def test_a_number_setting_reads_its_digits_not_its_length(monkeypatch):
    from kjit import settings
    monkeypatch.setenv("KJIT_COMPILE_JOBS", "0" * 50 + "4")
    assert settings.compile_jobs() == 4
    monkeypatch.setenv("KJIT_COMPILE_JOBS", "1" + "0" * 18)
    with pytest.raises(settings.SettingError, match="at most 18 digits"):
        settings.compile_jobs()


# --- names that are not UTF-8 ------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["-I", "-D", "source"])
def test_a_name_that_is_not_utf8_is_refused_by_name(tmp_path, flag):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k() {}\n')
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/bad\xff")
    args = {"-I": [src, "-I", bad], "-D": [src, "-DX=" + os.fsdecode(b"\xfe")],
            "source": [bad + ".cu"]}[flag]
    if flag == "-I":
        os.mkdir(bad)
    if flag == "source":
        Path(bad + ".cu").write_text(src.read_text())
    res = run_cli("compile", *args, "--arch", "sm_90", "-o", tmp_path / "k.cubin", "--json",
                  env={"KJIT_CACHE_DIR": str(tmp_path / "cache")})
    error = json.loads(res.stdout)["error"]
    assert res.returncode in (1, 2) and error["exit_code"] == res.returncode, error
    assert "is not UTF-8" in error["message"] and (flag in error["message"]), error
    assert "codec" not in error["message"]


# --- out of memory -----------------------------------------------------------------------------

def test_out_of_memory_under_an_address_space_limit_says_what_to_do(tmp_path):
    """A 900 MiB input (within the 1 GiB binary limit) read under a 600 MiB address-space
    limit: MemoryError in kjit's reader, reported as exit 1 with the limit to raise."""
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(900 << 20)   # sparse: no disk
    limit = 600 << 20

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    for as_json in (False, True):
        res = run_cli("inspect", big, *(["--json"] if as_json else []), preexec_fn=cap,
                      env={"KJIT_CACHE_DIR": str(tmp_path / "cache")})
        assert res.returncode == 1, res.stderr[-3000:]
        assert b"Traceback" not in res.stderr
        if as_json:
            error = json.loads(res.stdout)["error"]
            assert error["type"] == "OutOfMemory" and "ulimit -v" in error["message"]
        else:
            assert b"out of memory" in res.stderr and b"raise the limit" in res.stderr


# --- the HIP backend without ROCm --------------------------------------------------------------

@pytest.mark.parametrize("command", ["compile", "build"])
def test_hip_without_hiprtc_fails_naming_what_to_install(tmp_path, command):
    """Issue 40 saw `--backend hip` exit 0 on a machine without ROCm; without a hiprtc it
    must fail (exit 1) and say what to install, writing nothing. The machine's own hiprtc,
    if any, is hidden from the command by a sitecustomize that names no library."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import kjit.hip.loader as l\nl.HIPRTC_NAMES = ('libkjit-no-such-hiprtc.so',)\n")
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float *x) { x[0] = 1; }\n')
    out = tmp_path / ("k.hsaco" if command == "compile" else "k.hipfb")
    env = {"KJIT_CACHE_DIR": str(tmp_path / "cache"), "ROCM_PATH": str(tmp_path / "no-rocm"),
           "HIP_PATH": str(tmp_path / "no-rocm"),
           "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "kjit.cli.main", command, str(src), "--backend",
                          "hip", "--arch", "gfx90a", "-o", str(out), "--json"],
                         env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, (res.stdout, res.stderr[-2000:])
    message = json.loads(res.stdout)["error"]["message"]
    assert "no hiprtc library found" in message and "install" in message
    assert not out.exists()


def test_a_cache_dir_too_long_for_the_filesystem_is_a_setting_error_from_the_library(monkeypatch):
    """kjit.compile in a program (not the CLI): a KJIT_CACHE_DIR of 100,000 characters is named
    as a bad setting, not a raw OSError (file name too long) from looking for the directory."""
    import kjit
    from kjit.errors import KjitError
    monkeypatch.setenv("KJIT_CACHE_DIR", "/tmp/" + "a" * 100_000)
    with pytest.raises(KjitError, match="KJIT_CACHE_DIR"):
        kjit.compile('extern "C" __global__ void k() {}', arch="sm_90")
