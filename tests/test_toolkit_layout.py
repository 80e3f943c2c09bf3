"""Header layouts users really have: PyTorch's runtime-header wheels (cuda_fp16.h, mma.h, no
crt/) beside a CUDA toolkit that has crt/, as on the GPU machine. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import kjit
from kjit.compiler import toolkit_headers

WMMA = r'''
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void wmma16(const half* a, const half* b, float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
'''


def _split_layout(tmp_path: Path) -> tuple[Path, Path]:
    """(runtime headers without crt/, a toolkit root whose include/ has crt/), built from the
    installed wheels with symlinks."""
    real = Path(toolkit_headers.located()["cudart"])
    runtime = tmp_path / "torch-site" / "nvidia" / "cu13" / "include"
    runtime.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name not in ("crt", "cccl"):
            (runtime / entry.name).symlink_to(entry)
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "crt").symlink_to(real / "crt")
    return runtime, toolkit


@pytest.fixture
def split_layout(tmp_path, monkeypatch):
    runtime, toolkit = _split_layout(tmp_path)
    cccl = toolkit_headers.located()["cccl"]
    wheel_dir = toolkit_headers._on_sys_path

    def on_sys_path(lib, anchor):  # only the runtime-header wheel: no crt/ anywhere on sys.path
        if anchor == toolkit_headers.CRT_ANCHOR:
            return None
        return wheel_dir(lib, anchor)

    monkeypatch.setattr(toolkit_headers, "_on_sys_path", on_sys_path)
    monkeypatch.setattr(toolkit_headers, "located", lambda: {"cccl": cccl, "cudart": str(runtime)})
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    toolkit_headers.crt_dir.cache_clear()
    yield runtime, toolkit
    toolkit_headers.crt_dir.cache_clear()


def test_crt_comes_from_the_toolkit_when_the_runtime_wheel_has_none(split_layout):
    runtime, toolkit = split_layout
    dirs = toolkit_headers.dirs()
    assert str(runtime) in dirs
    assert dirs[-1] == os.path.realpath(toolkit / "include")
    obj = kjit.compile(WMMA, arch="sm_80", target="cubin", cache=False)
    assert "wmma16" in obj.entry_points


def test_crt_from_a_system_toolkit_without_cuda_home(split_layout, monkeypatch):
    runtime, toolkit = split_layout
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setattr(toolkit_headers, "SYSTEM_TOOLKITS", (str(toolkit),))
    toolkit_headers.crt_dir.cache_clear()
    assert toolkit_headers.dirs()[-1] == os.path.realpath(toolkit / "include")
    assert "wmma16" in kjit.compile(WMMA, arch="sm_90", cache=False).entry_points
