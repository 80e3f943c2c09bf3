"""`kjit build`: multi-architecture fatbins on a machine with no GPU."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from kjit.compiler.targets import nvrtc_supported
from click.testing import CliRunner

from kjit import arch as arch_mod
from kjit import driver
from kjit.build import resolve_archs, resolve_ptx, run_build
from kjit.cli.main import cli
from kjit.formats.fatbin import entries
from kjit.errors import CompileError, InvalidOptionError
from kjit.objectcode import ObjectCode

from test_build_containers import CUOBJDUMP, needs_cuobjdump

LIB = r'''
#include "tile.cuh"
extern "C" __global__ void scale(float* p, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = a * p[i];
}
extern "C" __global__ void tile_sum(const float* x, float* out) {
    __shared__ float t[TILE];
    t[threadIdx.x] = x[blockIdx.x * TILE + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) { float s = 0; for (int k = 0; k < TILE; ++k) s += t[k]; out[blockIdx.x] = s; }
}
'''
HEADER = "#pragma once\n#ifndef TILE\n#error define TILE\n#endif\n"
TEMPLATE = r'''
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''


@pytest.fixture
def lib(tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "tile.cuh").write_text(HEADER)
    src = tmp_path / "lib.cu"
    src.write_text(LIB)
    return src


def invoke(*args: str):
    return CliRunner().invoke(cli, ["build", *map(str, args)])


def lib_args(lib, out, *more):
    return (lib, "-o", out, "-I", lib.parent / "include", "-D", "TILE=64", *more)


def test_three_archs_plus_ptx(lib, tmp_path):
    out = tmp_path / "lib.fatbin"
    r = invoke(*lib_args(lib, out, "--arch", "sm_80,sm_90", "--arch", "sm_100",
                         "--ptx", "compute_90"))
    assert r.exit_code == 0, r.output
    got = [(e.kind, e.arch) for e in entries(out.read_bytes(), "fatbin")]
    assert got == [("cubin", "sm_80"), ("cubin", "sm_90"), ("cubin", "sm_100"),
                   ("ptx", "compute_90")]
    assert set(ObjectCode.from_file(out).entry_points) == {"scale", "tile_sum"}
    assert "4 entries" in r.output and "0 of 4 compiles reused" in r.output


@needs_cuobjdump
def test_cuobjdump_sees_every_entry(lib, tmp_path):
    out = tmp_path / "lib.fatbin"
    assert invoke(*lib_args(lib, out, "--arch", "sm_80,sm_90,sm_100", "--ptx",
                            "compute_90")).exit_code == 0
    listing = subprocess.run([CUOBJDUMP, "--list-elf", "--list-ptx", str(out)],
                             capture_output=True, text=True, check=True).stdout
    assert sorted(re.findall(r"\.(sm_\d+)\.cubin", listing)) == ["sm_100", "sm_80", "sm_90"]
    assert re.findall(r"\.(sm_\d+)\.ptx", listing) == ["sm_90"]


def test_same_inputs_give_byte_identical_fatbins(lib, tmp_path):
    a, b = tmp_path / "a.fatbin", tmp_path / "b.fatbin"
    assert invoke(*lib_args(lib, a, "--arch", "sm_80,sm_90,sm_100")).exit_code == 0
    # a fresh compile (no cache), archs in another order, one job: still the same bytes
    r = invoke(*lib_args(lib, b, "--arch", "sm_100", "--arch", "sm_90,sm_80", "--no-cache",
                         "--jobs", "1"))
    assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()


def test_parallel_and_serial_builds_agree(lib, tmp_path):
    objs = [run_build([lib], output=tmp_path / f"{j}.fatbin", archs=["sm_80,sm_86,sm_90,sm_100"],
                      options=_opts(lib), jobs=j, cache=False).object for j in (1, 2)]
    assert objs[0].code == objs[1].code


def _opts(lib):
    from kjit.compiler.options import CompileOptions
    return CompileOptions(include_dirs=[lib.parent / "include"], defines=["TILE=64"])


def test_progress_ticks_once_per_compile(lib, tmp_path):
    ticks = []
    run_build([lib], output=tmp_path / "p.fatbin", archs=["sm_80,sm_90"], options=_opts(lib),
              jobs=2, progress=lambda total: (ticks.append(("total", total)),
                                              lambda: ticks.append("tick"))[1])
    assert ticks == [("total", 3), "tick", "tick", "tick"]  # two cubins and one PTX


def test_name_expressions_travel_in_the_sidecar(tmp_path):
    src = tmp_path / "axpy.cu"
    src.write_text(TEMPLATE)
    out = tmp_path / "axpy.fatbin"
    r = invoke(src, "-o", out, "--arch", "sm_80,sm_90", "--name-expression", "axpy<float>",
               "--name-expression", "axpy<double>")
    assert r.exit_code == 0, r.output
    side = tmp_path / "axpy.fatbin.kjit.json"
    assert side.exists()
    obj = ObjectCode.from_file(out)
    assert set(obj.symbols) == {"axpy<float>", "axpy<double>"}
    assert obj.symbols["axpy<float>"] == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert obj.lowered_name("axpy<double>") in obj.entry_points
    assert "axpy<float> -> _Z4axpyIfEvT_PKS0_PS0_i" in r.output


def test_name_expressions_need_one_source(tmp_path, lib):
    other = tmp_path / "other.cu"
    other.write_text(TEMPLATE)
    r = invoke(lib, other, "--arch", "sm_90", "--name-expression", "axpy<float>")
    assert r.exit_code == 1 and "one source file" in r.output


@pytest.mark.skipif(driver.available(), reason="this machine has a GPU: native resolves")
def test_native_without_a_gpu_is_a_clear_error(lib, tmp_path):
    r = invoke(*lib_args(lib, tmp_path / "n.fatbin", "--arch", "native"))
    assert r.exit_code == 2
    assert "--arch native needs a CUDA driver and GPU" in r.output
    assert "--arch sm_80" in r.output and "Traceback" not in r.output


@pytest.mark.skipif(driver.available(), reason="this machine has a GPU: the default resolves")
def test_no_arch_without_a_gpu_says_how_to_choose(lib, tmp_path):
    r = invoke(*lib_args(lib, tmp_path / "n.fatbin"))
    assert r.exit_code == 2 and "--arch sm_90" in r.output


def test_all_is_every_arch_nvrtc_supports(lib, tmp_path):
    out = tmp_path / "all.fatbin"
    r = invoke(*lib_args(lib, out, "--arch", "all"))
    assert r.exit_code == 0, r.output
    cubins = [e.arch for e in entries(out.read_bytes()) if e.kind == "cubin"]
    assert cubins == [f"sm_{n}" for n in nvrtc_supported()]
    newest = max(nvrtc_supported())
    assert [e.arch for e in entries(out.read_bytes()) if e.kind == "ptx"] == [f"compute_{newest}"]


def test_families_and_arch_specific_targets(lib, tmp_path):
    out = tmp_path / "fam.fatbin"
    r = invoke(*lib_args(lib, out, "--arch", "sm_90a,sm_100f", "--ptx", "compute_90"))
    assert r.exit_code == 0, r.output
    assert [(e.kind, e.arch) for e in entries(out.read_bytes())] == [
        ("cubin", "sm_90a"), ("cubin", "sm_100f"), ("ptx", "compute_90")]


@pytest.mark.parametrize("bad", ["sm_35", "dropped"])
def test_an_arch_nvrtc_cannot_target_lists_the_supported_ones(lib, tmp_path, bad):
    if bad == "dropped":   # one this NVRTC no longer targets: sm_61 (NVRTC 13), sm_37 (NVRTC 12)
        bad = next(f"sm_{n}" for n in (61, 37) if n not in nvrtc_supported())
    r = invoke(*lib_args(lib, tmp_path / "x.fatbin", "--arch", f"sm_90,{bad}"))
    assert r.exit_code == 2
    assert bad in r.output and "supports" in r.output
    for n in nvrtc_supported():
        assert f"sm_{n}" in r.output
    assert not (tmp_path / "x.fatbin").exists()


def test_a_misspelt_arch_says_what_is_accepted(lib, tmp_path):
    r = invoke(*lib_args(lib, tmp_path / "x.fatbin", "--arch", "hopper"))
    assert r.exit_code == 2 and "sm_XY" in r.output


def test_rebuild_with_nothing_changed_reuses_the_cache_quickly(lib, tmp_path):
    out = tmp_path / "lib.fatbin"
    args = lib_args(lib, out, "--arch", "sm_80,sm_90,sm_100", "--json")
    first = json.loads(invoke(*args).output)
    assert (first["compiles"], first["reused"], first["compiled"]) == (4, 0, 4)
    before = out.read_bytes()
    second = json.loads(invoke(*args).output)
    assert (second["compiles"], second["reused"], second["compiled"]) == (4, 4, 0)
    assert all(e["cache_hit"] for e in second["entries"])
    assert second["seconds"] < 0.5, second["seconds"]
    assert out.read_bytes() == before
    text = invoke(*lib_args(lib, out, "--arch", "sm_80,sm_90,sm_100")).output
    assert "4 of 4 compiles reused" in text and text.count("reused from cache") == 4


def test_a_changed_header_is_recompiled(lib, tmp_path):
    out = tmp_path / "lib.fatbin"
    args = lib_args(lib, out, "--arch", "sm_90", "--no-ptx", "--json")
    assert json.loads(invoke(*args).output)["reused"] == 0
    (lib.parent / "include" / "tile.cuh").write_text(HEADER + "// edited\n")
    assert json.loads(invoke(*args).output)["reused"] == 0


def test_ptx_defaults_and_no_ptx(lib, tmp_path):
    assert resolve_ptx(["sm_80", "sm_90a"], [], False) == ["compute_90"]
    assert resolve_ptx(["sm_80"], ["sm_75,compute_80"], False) == ["compute_75", "compute_80"]
    assert resolve_ptx(["sm_80"], [], True) == []
    with pytest.raises(InvalidOptionError, match="contradict"):
        resolve_ptx(["sm_80"], ["compute_80"], True)
    out = tmp_path / "noptx.fatbin"
    assert invoke(*lib_args(lib, out, "--arch", "sm_80", "--no-ptx")).exit_code == 0
    assert [e.kind for e in entries(out.read_bytes())] == ["cubin"]


def test_ptx_only_build(lib, tmp_path):
    out = tmp_path / "ptx.fatbin"
    assert invoke(*lib_args(lib, out, "--arch", "compute_80")).exit_code == 0
    assert [(e.kind, e.arch) for e in entries(out.read_bytes())] == [("ptx", "compute_80")]


def test_resolve_archs_sorts_and_dedupes():
    assert resolve_archs(["sm_90, sm_80", "sm_90", "SM_100"]) == ["sm_80", "sm_90", "sm_100"]


def test_defines_and_includes_reach_the_compiler(lib, tmp_path):
    r = invoke(lib, "-o", tmp_path / "x.fatbin", "--arch", "sm_90", "-I", lib.parent / "include")
    assert r.exit_code == 1 and "define TILE" in r.output and "Traceback" not in r.output


def test_compile_errors_from_parallel_workers_are_reported(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(int* p) { p[0] = undefined_name; }\n')
    with pytest.raises(CompileError) as info:
        run_build([bad], output=tmp_path / "bad.fatbin", archs=["sm_80,sm_90,sm_100"], jobs=2)
    assert "undefined_name" in str(info.value) and "bad.cu" in str(info.value)
    r = invoke(bad, "-o", tmp_path / "bad.fatbin", "--arch", "sm_80,sm_90,sm_100")
    assert r.exit_code == 1 and "undefined_name" in r.output and "Traceback" not in r.output


def test_compressed_output(lib, tmp_path):
    small, plain = tmp_path / "s.fatbin", tmp_path / "p.fatbin"
    assert invoke(*lib_args(lib, small, "--arch", "sm_80,sm_90", "--compress", "size")).exit_code == 0
    assert invoke(*lib_args(lib, plain, "--arch", "sm_80,sm_90")).exit_code == 0
    assert len(small.read_bytes()) < len(plain.read_bytes())
    assert all(e.compression == "zstd" for e in entries(small.read_bytes()))


LIB_A = 'extern "C" __device__ float twice(float v) { return 2.0f * v; }\n'
LIB_B = ('extern "C" __device__ float twice(float v);\n'
         'extern "C" __global__ void use(float* p) { p[threadIdx.x] = twice(p[threadIdx.x]); }\n')


@pytest.mark.parametrize("lto", [False, True])
def test_several_sources_are_linked_per_arch(tmp_path, lto):
    a, b = tmp_path / "a.cu", tmp_path / "b.cu"
    a.write_text(LIB_A)
    b.write_text(LIB_B)
    out = tmp_path / "ab.fatbin"
    r = invoke(a, b, "-o", out, "--arch", "sm_80,sm_90", *(["--lto"] if lto else []), "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{"):])
    assert summary["links"] == 2 and summary["compiles"] == 4
    es = entries(out.read_bytes())
    assert [(e.kind, e.arch) for e in es] == [("cubin", "sm_80"), ("cubin", "sm_90")]
    assert ObjectCode.from_file(out).entry_points == ("use",)


def test_link_with_an_ltoir_file(tmp_path):
    a, b = tmp_path / "a.cu", tmp_path / "b.cu"
    a.write_text(LIB_A)
    b.write_text(LIB_B)
    ltoir = tmp_path / "a.ltoir"
    r = CliRunner().invoke(cli, ["compile", str(a), "--arch", "sm_90", "--emit", "ltoir", "-o", str(ltoir)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "b.fatbin"
    r = invoke(b, "--link", ltoir, "--lto", "-o", out, "--arch", "sm_90")
    assert r.exit_code == 0, r.output
    assert ObjectCode.from_file(out).entry_points == ("use",)
    r = invoke(b, "--link", ltoir, "--lto", "-o", out, "--arch", "sm_90", "--ptx", "compute_90")
    assert r.exit_code == 1 and "--ptx cannot be combined" in r.output


def _hiprtc_available() -> bool:
    try:
        from kjit.compiler import hiprtc
        hiprtc.version()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _hiprtc_available(), reason="hiprtc (libamdhip64) is not installed")
def test_hip_backend_builds_an_offload_bundle(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text('extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }\n')
    out = tmp_path / "k.hipfb"
    r = invoke(src, "-o", out, "--backend", "hip", "--arch", "gfx90a,gfx908")
    assert r.exit_code == 0, r.output
    es = [e for e in entries(out.read_bytes()) if e.kind == "hsaco"]
    assert sorted(e.arch for e in es) == ["gfx908", "gfx90a"]
    assert ObjectCode.from_file(out).entry_points == ("fill",)


def test_hip_backend_refuses_cuda_only_options(tmp_path):
    src = tmp_path / "k.hip"
    src.write_text("")
    r = invoke(src, "--backend", "hip", "--arch", "gfx90a", "--ptx", "compute_90")
    assert r.exit_code == 1 and "CUDA-only" in r.output


def test_rerun_from_a_checkout_reuses_every_compile(lib, tmp_path, monkeypatch):
    """`kjit build` run twice from a repository root holding a second kjit tree (as after
    `pip install .`): the workers import the kjit that started them, so every compile of the
    second run is reused."""
    import shutil
    from pathlib import Path
    import kjit
    from kjit.compiler import pool
    repo = tmp_path / "repo"
    shutil.copytree(Path(kjit.__file__).resolve().parent, repo / "kjit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    marker = tmp_path / "second-kjit-imported"
    with open(repo / "kjit" / "__init__.py", "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(repo)
    monkeypatch.setattr(pool, "_pool", None)   # workers started from this directory
    args = lib_args(lib, tmp_path / "lib.fatbin", "--arch", "sm_80,sm_90,sm_100", "--jobs", "2",
                    "--json")
    first = json.loads(invoke(*args).output)
    second = json.loads(invoke(*args).output)
    pool.shared_pool().close()
    assert (first["compiled"], second["reused"], second["compiles"]) == (4, 4, 4)
    assert not marker.exists()
