"""Toolkit and CCCL headers out of the box, in every place that compiles; the switch that
turns them off; what `kjit info` says; errors inside them; HIP's built-in header names.
(CPU: NVRTC and hiprtc need no GPU.)"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import kjit
from kjit.compiler import cached as compiled
from kjit.cli.main import cli
from kjit.compiler import hip_headers, hiprtc, include_path, toolkit_headers
from kjit.errors import CompileError, InvalidOptionError

FP16 = r'''
#include <cuda_fp16.h>
extern "C" __global__ void halve(__half* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __hmul(x[i], __float2half(0.5f));
}
'''
CUB = r'''
#include <cub/warp/warp_reduce.cuh>
extern "C" __global__ void warp_sum(const int* x, int* out) {
    using WR = cub::WarpReduce<int>;
    __shared__ typename WR::TempStorage tmp;
    int s = WR(tmp).Sum(x[threadIdx.x]);
    if (threadIdx.x == 0) *out = s;
}
'''


def run(*args):
    return CliRunner().invoke(cli, list(args))


# --- found without -I ------------------------------------------------------------------------
def _family_wheels() -> tuple[str, bool]:
    """(the runtime-header wheel of the installed family, whether nvidia-cuda-crt is
    installed): cuda-bindings' major is the family's. CUDA 12 has no crt/ wheel."""
    from importlib.metadata import PackageNotFoundError, version
    major = version("cuda-bindings").split(".")[0]
    try:
        crt = bool(version("nvidia-cuda-crt"))
    except PackageNotFoundError:
        crt = False
    return ("nvidia-cuda-runtime" if major == "13" else f"nvidia-cuda-runtime-cu{major}"), crt


def test_toolkit_and_cccl_dirs_are_found():
    dirs = toolkit_headers.dirs()
    assert [Path(d).name for d in dirs[:2]] == ["cccl", "include"]       # CCCL first
    assert (Path(dirs[0]) / "cub" / "cub.cuh").is_file()
    assert (Path(dirs[1]) / "cuda_fp16.h").is_file()
    # crt/ (mma.h includes it) beside the runtime headers from nvidia-cuda-crt; without that
    # wheel (CUDA 12) from a toolkit's include directory, searched last, where there is one
    if _family_wheels()[1]:
        assert len(dirs) == 2 and (Path(dirs[1]) / "crt" / "mma.h").is_file()
    else:
        assert dirs[2:] == tuple(filter(None, [toolkit_headers.crt_dir(dirs[1])]))
        assert all((Path(d) / "crt" / "mma.h").is_file() for d in dirs[2:])


@pytest.mark.parametrize("target", ["cubin", "ptx", "ltoir"])
def test_compile_with_toolkit_headers_and_no_include_dirs(target):
    obj = kjit.compile(FP16, arch="sm_90", target=target)
    assert obj.kind in ("cubin", "ptx", "ltoir") and obj.code


def test_lto_path_links_a_cub_kernel():
    lto = kjit.compile(CUB, arch="sm_90", target="ltoir")
    res = kjit.link([lto], arch="sm_90", lto=True)
    assert "warp_sum" in res.object.entry_points


def test_decorator_compiles_with_toolkit_headers():
    @kjit.kernel
    def halve():
        return FP16
    assert halve.compile(arch="sm_90").entry_points == ("halve",)


def test_turned_off_gives_nvrtcs_own_error():
    with pytest.raises(CompileError, match=r'open source file "cuda_fp16.h"'):
        kjit.compile(FP16, arch="sm_90", options=kjit.CompileOptions(toolkit_headers=False))


def test_switch_is_validated_and_keyed():
    with pytest.raises(InvalidOptionError, match="toolkit_headers must be True or False"):
        kjit.CompileOptions(toolkit_headers="yes")
    src = 'extern "C" __global__ void k() {}\n'
    on = compiled.compile_key(src, arch="sm_90")
    off = compiled.compile_key(src, arch="sm_90", options=kjit.CompileOptions(toolkit_headers=False))
    assert on != off


def test_user_headers_come_before_the_toolkits(tmp_path):
    (tmp_path / "cuda_fp16.h").write_text("#error the user's cuda_fp16.h wins\n")
    with pytest.raises(CompileError, match="the user's cuda_fp16.h wins") as info:
        kjit.compile(FP16, arch="sm_90", options=kjit.CompileOptions(include_dirs=[str(tmp_path)]))
    assert "toolkit header" not in info.value.message               # the user's own header
    with pytest.raises(CompileError, match="in-memory one wins"):
        kjit.compile(FP16, arch="sm_90", options=kjit.CompileOptions(
            headers={"cuda_fp16.h": "#error the in-memory one wins\n"}))


def test_search_order_user_then_extra_then_toolkit(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    opts = kjit.CompileOptions(include_dirs=[str(a)], extra=[f"-I{b}"], std_headers=False)
    path = include_path.for_options(opts, "cuda")
    assert path.dirs == (str(a.resolve()), str(b)) + toolkit_headers.dirs()
    assert path.automatic_dirs == toolkit_headers.dirs()
    off = include_path.for_options(opts.replace(toolkit_headers=False), "cuda")
    assert off.dirs == (str(a.resolve()), str(b)) and off.automatic_dirs == ()
    # kjit's standard headers (on by default) come after all of those
    from kjit.compiler import stdheaders
    assert include_path.for_options(opts.replace(std_headers=True), "cuda").dirs == \
        path.dirs + (stdheaders.STDINC,)


def test_error_inside_a_toolkit_header_names_the_versions():
    # a macro that breaks the header: the error is inside it, and only versions can explain
    # an error there when the user's code is right
    with pytest.raises(CompileError) as info:
        kjit.compile("#define __CUDA_FP16_TYPES_EXIST__ 1\n#define __half int\n#include <cuda_fp16.h>\n",
                     arch="sm_90")
    msg = info.value.message
    nvrtc = ".".join(map(str, kjit.compiler.nvrtc.version()))
    cccl_dir = toolkit_headers.dirs()[0]
    assert "inside a toolkit header" in msg and f"NVRTC {nvrtc}" in msg
    assert f"CCCL {toolkit_headers.cccl_version(cccl_dir)}" in msg
    assert f"nvidia-cuda-cccl {toolkit_headers.installed()['nvidia-cuda-cccl']}" in msg
    assert "Tested together" in msg


def test_a_toolkit_headers_own_error_directive_is_its_message_not_versions():
    with pytest.raises(CompileError) as info:
        kjit.compile("#include <cuda/std/cstdint>\n", arch="sm_90",
                     options=kjit.CompileOptions(std="c++11"))
    msg = info.value.message
    assert "stopped the compile with its own #error" in msg and "C++ 17" in msg
    assert "inside a toolkit header" not in msg and "Tested together" not in msg


def test_error_in_the_users_code_has_no_toolkit_note():
    with pytest.raises(CompileError) as info:
        kjit.compile(FP16.replace("__hmul(", "__hmul_nope("), arch="sm_90")
    assert "toolkit header" not in info.value.message


# --- where the directories come from -------------------------------------------------------
def test_directories_are_remembered_in_the_cache_dir(monkeypatch):
    # no wheel on sys.path (a conda or system toolkit): pathfinder is asked, and remembered
    monkeypatch.setattr(toolkit_headers, "_on_sys_path", lambda lib, anchor: None)
    toolkit_headers.located.cache_clear()
    first = toolkit_headers.located()
    record = Path(os.environ["KJIT_CACHE_DIR"]) / toolkit_headers.RECORD_FILE
    assert first in json.loads(record.read_text()).values()
    asked = []
    monkeypatch.setattr(toolkit_headers, "_ask_pathfinder",
                        lambda: asked.append(1) or dict(first))
    toolkit_headers.located.cache_clear()
    assert toolkit_headers.located() == first and asked == []        # read back, not asked
    data = json.loads(record.read_text())
    for v in data.values():
        v["cccl"] = "/nonexistent/include/cccl"                       # a wheel removed since
    record.write_text(json.dumps(data))
    toolkit_headers.located.cache_clear()
    assert toolkit_headers.located() == first and asked == [1]       # asked again
    toolkit_headers.located.cache_clear()


def test_a_wheel_on_sys_path_is_preferred_to_a_system_toolkit(tmp_path, monkeypatch):
    """Seen on the GPU machine: pathfinder answered with /usr/local/cuda's CCCL 3.0 while the
    environment had the nvidia-cuda-cccl 13.3 wheel on its path."""
    system = {}
    for lib, anchor in toolkit_headers.LIBS:
        d = tmp_path / "usr-local-cuda" / lib
        (d / anchor).parent.mkdir(parents=True, exist_ok=True)
        (d / anchor).write_text("")
        system[lib] = str(d)
    monkeypatch.setattr(toolkit_headers, "_pathfinder_remembered", lambda: dict(system))
    toolkit_headers.located.cache_clear()
    try:
        found = toolkit_headers.located()
        assert all(found[lib] != system[lib] for lib in system)      # the wheels of this venv
        monkeypatch.setattr(toolkit_headers, "_on_sys_path", lambda lib, anchor: None)
        toolkit_headers.located.cache_clear()
        assert toolkit_headers.located() == system                      # no wheel: the toolkit
    finally:
        toolkit_headers.located.cache_clear()


def test_wheels_on_sys_path_are_found_where_pathfinder_does_not_look(tmp_path, monkeypatch):
    """`pip install --target DIR` + PYTHONPATH: pathfinder searches site-packages only."""
    fake = tmp_path / "site"
    cccl = fake / "nvidia" / "cu13" / "include" / "cccl"
    (cccl / "cuda" / "std").mkdir(parents=True)
    (cccl / "cuda" / "std" / "version").write_text("// anchor\n")
    monkeypatch.setattr(toolkit_headers, "_pathfinder_remembered", lambda: {"cccl": None, "cudart": None})
    monkeypatch.setattr("sys.path", ["", str(fake)] + [p for p in __import__("sys").path])
    toolkit_headers.located.cache_clear()
    try:
        assert toolkit_headers.located()["cccl"] == str(cccl.resolve())
        assert toolkit_headers.dirs()[0] == str(cccl.resolve())
    finally:
        toolkit_headers.located.cache_clear()


def test_missing_pathfinder_means_no_automatic_dirs(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_pathfinder(name, *a, **k):
        if name.startswith("cuda.pathfinder"):
            raise ImportError(name)
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_pathfinder)
    assert toolkit_headers._ask_pathfinder() == {"cccl": None, "cudart": None}


# --- command line --------------------------------------------------------------------------
@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "fp16.cu").write_text(FP16)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_cli_compile_finds_toolkit_headers_and_can_turn_them_off(work):
    res = run("compile", "fp16.cu", "--arch", "sm_90")
    assert res.exit_code == 0, res.output
    assert (work / "fp16.cubin").is_file()
    res = run("compile", "fp16.cu", "--arch", "sm_90", "--no-toolkit-headers", "-o", "x.cubin")
    assert res.exit_code == 1 and 'open source file "cuda_fp16.h"' in res.output
    assert "Traceback" not in res.output


def test_cli_build_finds_toolkit_headers_and_can_turn_them_off(work):
    (work / "cub.cu").write_text(CUB)
    res = run("build", "cub.cu", "--arch", "sm_80,sm_90", "-o", "cub.fatbin", "-j", "1")
    assert res.exit_code == 0, res.output
    assert (work / "cub.fatbin").is_file()
    res = run("build", "fp16.cu", "--arch", "sm_90", "--no-toolkit-headers", "-j", "1")
    assert res.exit_code == 1 and "cuda_fp16.h" in res.output


def test_cli_build_lto_with_a_cub_kernel(work):
    (work / "cub.cu").write_text(CUB)
    res = run("build", "cub.cu", "--arch", "sm_90", "--lto", "-o", "lto.fatbin", "-j", "1")
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("command", ["compile", "build"])
def test_quoted_include_next_to_the_source_without_I(tmp_path, monkeypatch, command):
    """Issue 16, item 9: as nvcc, `kjit compile dir/k.cu` finds dir/x.cuh; the key follows it."""
    src_dir = tmp_path / "project" / "src"
    src_dir.mkdir(parents=True)
    (src_dir / "k.cu").write_text('#include "x.cuh"\nextern "C" __global__ void k(float* y) '
                                  '{ y[0] = SCALE; }\n')
    (src_dir / "x.cuh").write_text("#define SCALE 2.0f\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = elsewhere / ("k.cubin" if command == "compile" else "k.fatbin")
    args = [command, str(src_dir / "k.cu"), "--arch", "sm_90", "-o", str(out)]
    res = run(*args)
    assert res.exit_code == 0, res.output
    first = out.read_bytes()
    (src_dir / "x.cuh").write_text("#define SCALE 3.0f\n")
    res = run(*args)
    assert res.exit_code == 0, res.output
    assert out.read_bytes() != first
    monkeypatch.chdir(tmp_path / "project")                          # a relative path too
    res = run(command, "src/k.cu", "--arch", "sm_90", "-o", str(out))
    assert res.exit_code == 0, res.output


def test_info_shows_header_dirs_and_versions():
    res = run("info", "--json")
    assert res.exit_code == 0, res.output
    headers = json.loads(res.output)["headers"]
    by_name = {d["name"]: d for d in headers["dirs"]}
    assert by_name["cccl"]["dir"] == toolkit_headers.dirs()[0]
    assert by_name["cccl"]["package"] == "nvidia-cuda-cccl" and by_name["cccl"]["version"]
    assert by_name["cccl"]["cccl_version"].count(".") == 2
    runtime, crt = _family_wheels()
    assert by_name["cudart"]["package"] == runtime
    assert ("nvidia-cuda-crt" in by_name["cudart"]["also"]) == crt
    text = run("info").output
    assert toolkit_headers.dirs()[0] in text and "nvidia-cuda-cccl" in text


def test_installed_versions_match_importlib_metadata():
    from importlib.metadata import version
    have = toolkit_headers.installed()
    for dist in ("nvidia-cuda-cccl", _family_wheels()[0], "cuda-pathfinder"):
        assert have[dist] == version(dist)


# --- HIP ---------------------------------------------------------------------------------
hip = pytest.mark.skipif(not hiprtc.available(),
                         reason="hiprtc not installed: apt-get install libamdhip64-5 libhiprtc-builtins5")
HIP_SRC = r'''
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_vector_types.h>
#include <hip/math_functions.h>
extern "C" __global__ void k(__half* x, float4* v) {
    x[0] = __float2half(sinf(__half2float(x[0])));
    v[0] = make_float4(1, 2, 3, 4);
}
'''


@hip
def test_hip_builtin_header_names_resolve():
    if hiprtc.version()[0] not in hip_headers.CHECKED_MAJOR:
        pytest.skip(f"hiprtc {hiprtc.version()} is not a release whose built-ins were checked")
    obj = kjit.compile(HIP_SRC, backend="hip", arch="gfx90a")
    assert obj.kind == "hsaco" and obj.cache_hit is False
    assert kjit.compile(HIP_SRC, backend="hip", arch="gfx90a").cache_hit is True
    with pytest.raises(CompileError, match="'hip/hip_runtime.h' file not found"):
        kjit.compile(HIP_SRC, backend="hip", arch="gfx90a",
                     options=kjit.CompileOptions(toolkit_headers=False))


@hip
def test_hip_header_hiprtc_lacks_gets_a_hint():
    with pytest.raises(CompileError, match="no bfloat16 type") as info:
        kjit.compile("#include <hip/hip_bfloat16.h>\n", backend="hip", arch="gfx90a")
    assert "docs/headers.md" in info.value.message


def test_crt_headers_installed_apart_from_the_runtime_headers_are_searched(tmp_path, monkeypatch):
    """`pip install --target` beside a system site-packages splits what a toolkit keeps in one
    include directory: mma.h in one place, crt/mma.h (nvidia-cuda-crt) in another."""
    from kjit.compiler import toolkit_headers
    runtime = tmp_path / "system" / "nvidia" / "cu13" / "include"
    runtime.mkdir(parents=True)
    (runtime / "cuda_runtime.h").write_text("")
    target = tmp_path / "target"
    crt = target / "nvidia" / "cu13" / "include" / "crt"
    crt.mkdir(parents=True)
    (crt / "mma.h").write_text("")
    monkeypatch.setattr("sys.path", [str(tmp_path / "system"), str(target)])
    toolkit_headers.crt_dir.cache_clear()
    try:
        assert toolkit_headers.crt_dir(str(runtime)) == str(crt.parent.resolve())
        (runtime / "crt").mkdir()
        (runtime / "crt" / "mma.h").write_text("")
        toolkit_headers.crt_dir.cache_clear()
        assert toolkit_headers.crt_dir(str(runtime)) is None   # one directory holds both
    finally:
        toolkit_headers.crt_dir.cache_clear()
