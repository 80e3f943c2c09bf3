"""`kjit compile` and `kjit info` through click's test runner (and once as a real process)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kjit.compiler.targets import nvrtc_supported
from click.testing import CliRunner

from kjit import arch as arch_mod
from kjit.cli.main import cli
from kjit.formats.elf import ElfFile

from conftest import SAXPY, TEMPLATE

BROKEN = 'extern "C" __global__ void k(float* x) {\n    x[0] = nope;\n}\n'
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A directory holding saxpy.cu, axpy.cu and bad.cu, made the current directory."""
    (tmp_path / "saxpy.cu").write_text(SAXPY)
    (tmp_path / "axpy.cu").write_text(TEMPLATE)
    (tmp_path / "bad.cu").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def test_compile_to_ptx_with_output(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_90", "--emit", "ptx", "-o", "saxpy.ptx")
    assert result.exit_code == 0, result.output
    ptx = (work / "saxpy.ptx").read_bytes()
    assert b".target sm_90" in ptx and b".entry saxpy(" in ptx
    assert "wrote saxpy.ptx (ptx, compute_90" in result.output and "kernels: saxpy" in result.output


def test_compile_cubin_by_default_next_to_the_source(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_90")
    assert result.exit_code == 0, result.output
    code = (work / "saxpy.cubin").read_bytes()
    assert ElfFile(code).machine == 190 and ElfFile(code).cuda_sm == 90


@pytest.mark.parametrize("emit, suffix", [("ltoir", ".ltoir"), ("ptx", ".ptx")])
def test_default_output_name_follows_the_target(work, emit, suffix):
    assert run("compile", "saxpy.cu", "--arch", "sm_90", "--emit", emit).exit_code == 0
    assert (work / f"saxpy{suffix}").exists()


def test_relocatable_output_is_still_a_cubin_file(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_90", "--relocatable", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["kind"] == "object" and info["output"] == "saxpy.cubin"
    text = run("compile", "saxpy.cu", "--arch", "sm_90", "--relocatable").output
    assert "(relocatable cubin, sm_90," in text and "object" not in text
    text = run("inspect", "saxpy.cubin").output
    assert text.startswith("saxpy.cubin: relocatable cubin,") and "object" not in text


def test_compile_json_schema(work):
    result = run("compile", "axpy.cu", "--arch", "sm_90", "--name-expression", "axpy<float>",
                 "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert set(info) == {"output", "kind", "arch", "size", "entry_points", "symbols", "log",
                         "cache_hit"}
    assert (info["output"], info["kind"], info["arch"]) == ("axpy.cubin", "cubin", "sm_90")
    assert info["size"] == (work / "axpy.cubin").stat().st_size
    assert info["symbols"] == {"axpy<float>": "_Z4axpyIfEvT_PKS0_PS0_i"}
    assert info["entry_points"] == ["_Z4axpyIfEvT_PKS0_PS0_i"]
    assert info["log"] == "" and info["cache_hit"] in (None, False)
    # no file but the output unless asked for; with --sidecar the symbols travel with it
    from kjit import ObjectCode
    assert sorted(p.name for p in work.glob("axpy.cubin*")) == ["axpy.cubin"]
    assert ObjectCode.from_file(work / "axpy.cubin").symbols == {}
    run("compile", "axpy.cu", "--arch", "sm_90", "--name-expression", "axpy<float>", "--sidecar")
    assert ObjectCode.from_file(work / "axpy.cubin").symbols == info["symbols"]
    run("compile", "axpy.cu", "--arch", "sm_90", "--name-expression", "axpy<float>")
    assert not (work / "axpy.cubin.kjit.json").exists()   # a sidecar of other bytes is gone


def test_ltoir_leaves_no_sidecar_unless_asked(work):
    assert run("compile", "saxpy.cu", "--arch", "sm_90", "--emit", "ltoir").exit_code == 0
    assert sorted(p.name for p in work.glob("saxpy.*")) == ["saxpy.cu", "saxpy.ltoir"]
    assert run("compile", "saxpy.cu", "--arch", "sm_90", "--emit", "ltoir", "--sidecar").exit_code == 0
    from kjit import ObjectCode
    assert ObjectCode.from_file(work / "saxpy.ltoir").arch == "sm_90"   # LTO-IR bytes hold none


def test_compile_options_reach_the_compiler(work):
    (work / "inc").mkdir()
    (work / "inc" / "name.h").write_text("#define KNAME from_include\n")
    (work / "named.cu").write_text('#include "name.h"\n'
                                   'extern "C" __global__ void KNAME(float* x) { x[0] = 1; }\n')
    result = run("compile", "named.cu", "--arch", "sm_90", "-I", "inc", "--json")
    assert json.loads(result.output)["entry_points"] == ["from_include"]
    (work / "plain.cu").write_text('extern "C" __global__ void KNAME(float* x) { x[0] = 1; }\n')
    result = run("compile", "plain.cu", "--arch", "sm_90", "-D", "KNAME=from_flag", "--json")
    assert json.loads(result.output)["entry_points"] == ["from_flag"]


def test_compile_error_exits_1_with_the_log_and_no_traceback(work):
    result = run("compile", "bad.cu", "--arch", "sm_90")
    assert result.exit_code == 1
    out = result.output
    assert 'bad.cu(2): error: identifier "nope" is undefined' in out
    assert "> 2 |     x[0] = nope;" in out
    assert "options: --gpu-architecture=sm_90" in out
    assert "Traceback" not in out
    assert not (work / "bad.cubin").exists()


def test_bad_arch_is_a_usage_error_listing_supported(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_91")
    assert result.exit_code == 2 and "sm_91" in result.output and "sm_90" in result.output
    assert "Traceback" not in result.output


def test_no_arch_without_gpu_says_how_to_pass_one(work, monkeypatch):
    monkeypatch.setattr(arch_mod, "device_arch", lambda ordinal=None: None)
    result = run("compile", "saxpy.cu")
    assert result.exit_code == 2 and "--arch sm_90" in result.output
    result = run("compile", "saxpy.cu", "--json", env={"KJIT_ARCH": "sm_89"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["arch"] == "sm_89"


def test_bad_option_values_are_usage_errors(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_90", "-D", "9LIVES")
    assert result.exit_code == 2 and "9LIVES" in result.output
    result = run("compile", "saxpy.cu", "--arch", "sm_90", "-I", "no/such/dir")
    assert result.exit_code == 2 and "no/such/dir" in result.output
    result = run("compile", "missing.cu", "--arch", "sm_90")
    assert result.exit_code == 2 and "missing.cu" in result.output


def test_unwritable_output_is_a_clear_error(work):
    result = run("compile", "saxpy.cu", "--arch", "sm_90", "-o", "no/such/dir/x.cubin")
    assert result.exit_code == 1 and "cannot write" in result.output
    assert "Traceback" not in result.output


def test_console_script_entry_point_reports_errors_without_traceback(work):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", "from kjit.cli.main import main; main()",
                           "compile", "bad.cu", "--arch", "sm_90"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert "identifier \"nope\" is undefined" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_help_lists_the_commands():
    result = run("--help")
    assert result.exit_code == 0
    assert "compile" in result.output and "info" in result.output
    assert run("--version").output.startswith("kjit, version ")


# --- info ---------------------------------------------------------------------------------

INFO_KEYS = {"kjit", "cuda_bindings", "nvrtc", "nvjitlink", "driver", "devices", "nvrtc_archs",
             "cache_dir"}


def test_info_json_schema():
    from importlib.metadata import version

    import kjit
    from kjit.compiler import nvrtc
    result = run("info", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert INFO_KEYS <= set(info)
    assert info["kjit"] == kjit.__version__
    assert info["cuda_bindings"] == version("cuda-bindings")
    assert info["nvrtc"] == "%d.%d" % nvrtc.version()
    assert info["nvjitlink"] and info["nvjitlink"].split(".")[0].isdigit()
    assert info["nvrtc_archs"] == [f"sm_{n}" for n in nvrtc_supported()]
    assert "sm_90" in info["nvrtc_archs"]
    assert isinstance(info["devices"], list)


def test_info_reports_the_cache_location():
    pytest.importorskip("kjit.cache.disk")
    info = json.loads(run("info", "--json").output)
    assert Path(info["cache_dir"]) == Path(os.environ["KJIT_CACHE_DIR"])


def test_info_without_a_driver():
    from kjit import driver
    if driver.available():
        pytest.skip("this machine has a CUDA device; see test_info_lists_devices")
    info = json.loads(run("info", "--json").output)
    assert info["driver"] is None and info["devices"] == []
    assert "libcuda" in info["driver_error"]
    text = run("info").output
    assert "driver          none (no CUDA driver found" in text
    assert "sm_90" in text and "NVRTC" in text


@pytest.mark.gpu
def test_info_lists_devices():
    from kjit import driver
    info = json.loads(run("info", "--json").output)
    assert info["driver"] and info["driver"][0].isdigit()
    assert len(info["devices"]) == driver.device_count() > 0
    dev = info["devices"][0]
    assert set(dev) == {"index", "name", "arch", "memory_bytes"}
    major, minor = driver.compute_capability(0)
    assert dev["arch"] == f"sm_{major}{minor}" and dev["memory_bytes"] > 2**30


def test_argument_errors_speak_shell_and_point_to_the_command_meant(tmp_path, monkeypatch):
    """A shell user's first mistakes: a virtual arch for a cubin (add --emit ptx), several
    archs for one binary (kjit build), no arch on a machine with no GPU (--arch, not
    arch='sm_90'), a cache key that is not one (exit 2, like any bad argument)."""
    from click.testing import CliRunner
    from kjit.cli.main import cli
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[0] = 1; }\n')
    out = str(tmp_path / "k.bin")
    run = lambda *a: CliRunner().invoke(cli, list(a))   # noqa: E731
    r = run("compile", str(src), "--arch", "compute_90", "-o", out)
    assert r.exit_code == 2 and "add --emit ptx" in r.output
    r = run("compile", str(src), "--arch", "sm_80,sm_90", "-o", out)
    assert r.exit_code == 2 and "kjit build SOURCE --arch sm_80,sm_90" in r.output
    monkeypatch.delenv("KJIT_ARCH", raising=False)
    from kjit import driver
    if not driver.available():
        r = run("compile", str(src), "-o", out)
        assert r.exit_code == 2 and "--arch sm_90" in r.output and "arch='sm_90'" not in r.output
    r = run("cache", "show", "12")
    assert r.exit_code == 2 and "not a cache key" in r.output


@pytest.mark.parametrize("args,said", [
    (["--arch", "sm_xx"], "--arch 'sm_xx' is not a CUDA architecture"),
    (["--arch", "gfx90a"], "(for an AMD GPU pass --backend hip)"),
    (["--arch", "sm_90", "--emit", "hsaco"], "add --backend hip"),
    (["--arch", "compute_90"], "--emit cubin (the default) needs a real architecture"),
    (["--arch", "sm_90", "--max-registers", "0"], "--max-registers must be a whole number in 1..255"),
    (["--arch", "sm_90", "-D", "1bad"], "-D '1bad' is not a valid macro name"),
    (["--arch", "sm_90", "--name-expression", ""], "--name-expression '' must not be empty"),
    (["--backend", "hip", "--arch", "sm_90"], "--arch 'sm_90' is not an AMD GPU target"),
])
def test_option_errors_name_the_options(work, args, said):
    r = run("compile", "saxpy.cu", *args)
    assert r.exit_code == 2 and said in r.stderr, r.output
    assert not re.search(r"\b(arch|target|backend|max_registers)=", r.stderr), r.stderr


@pytest.mark.parametrize("env,args", [
    ({"KJIT_CACHE": "maybe"}, ["--arch", "sm_90"]),     # read while the options are checked
    ({"KJIT_ARCH": "sm_xx"}, []),                        # read for want of --arch (no GPU)
    ({"KJIT_CACHE_SIZE": "abc"}, ["--arch", "sm_90"]),  # read when the cache opens
])
def test_a_bad_setting_is_one_error_line_whatever_reads_it(work, env, args):
    """In a fresh process, as a user runs it: what a process has already read decides which
    step reads a setting first."""
    name = next(iter(env))
    if name == "KJIT_ARCH" and arch_mod.device_arch() is not None:
        pytest.skip("a GPU is present: its arch is used, not $KJIT_ARCH")
    r = subprocess.run([sys.executable, "-m", "kjit.cli.main", "compile", "saxpy.cu", *args],
                       env=dict(os.environ, PYTHONPATH=str(REPO), **env), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and re.match(rf"error: \$?{name}=", r.stderr), r.stderr
    assert "Usage:" not in r.stderr and len(r.stderr.splitlines()) == 1
