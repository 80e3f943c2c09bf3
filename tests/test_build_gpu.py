"""GPU checks of `kjit build` output: fatbins load and run, PTX-only fatbins JIT on a GPU
they hold no cubin for, and kjit.nvinfo's figures agree with cuFuncGetAttribute."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit import arch as arch_mod
from kjit.build import run_build
from kjit.compiler.options import CompileOptions
from kjit.formats.fatbin import best_entry, entries
from kjit.formats.nvinfo import kernel_resources
from kjit.objectcode import ObjectCode

pytestmark = pytest.mark.gpu

LIBRARY = Path(__file__).resolve().parent.parent / "examples" / "library"
LIB_OPTS = CompileOptions(include_dirs=[LIBRARY / "include"], defines=["TILE=256"])


def device_sm() -> str:
    found = arch_mod.device_arch()
    assert found is not None
    return found.name


def run_library(fatbin: Path) -> None:
    module = kjit.load(fatbin)
    scale_add, block_sum = module.get_function("scale_add"), module.get_function("block_sum")
    n = 10_000
    x = np.random.default_rng(1).random(n, dtype=np.float32)
    dx, dy = kjit.to_device(x), kjit.to_device(np.zeros(n, np.float32))
    scale_add[kjit.cdiv(n, 128), 128](dx, dy, np.float32(3.0), np.float32(-1.0), np.int32(n))
    # float64 reference: the GPU fuses 3x-1 into one FMA, numpy's float32 rounds twice
    np.testing.assert_allclose(dy.get(), 3.0 * x.astype(np.float64) - 1.0, rtol=1e-6, atol=1e-7)
    blocks = kjit.cdiv(n, 256)
    dsum = kjit.to_device(np.zeros(blocks, np.float32))
    block_sum[blocks, 256](dx, dsum, np.int32(n))
    np.testing.assert_allclose(dsum.get(), np.add.reduceat(x, np.arange(0, n, 256)), rtol=1e-5)
    dcub = kjit.to_device(np.zeros(blocks, np.float32))   # CUB, found with no -I
    module.get_function("block_sum_cub")[blocks, 256](dx, dcub, np.int32(n))
    np.testing.assert_allclose(dcub.get(), np.add.reduceat(x, np.arange(0, n, 256)), rtol=1e-5)


def test_fatbin_for_several_archs_runs_and_matches_numpy(tmp_path):
    out = tmp_path / "library.fatbin"
    run_build([LIBRARY / "kernels.cu"], output=out, archs=["sm_80", device_sm()],
              options=LIB_OPTS)
    chosen = best_entry(entries(out.read_bytes()), device_sm())
    assert chosen is not None and chosen.kind == "cubin"
    run_library(out)


def test_ptx_only_fatbin_runs_on_a_gpu_it_has_no_cubin_for(tmp_path):
    out = tmp_path / "ptx_only.fatbin"
    run_build([LIBRARY / "kernels.cu"], output=out, archs=["compute_80"], options=LIB_OPTS)
    es = entries(out.read_bytes())
    assert [(e.kind, e.arch) for e in es] == [("ptx", "compute_80")]
    assert device_sm() != "sm_80"  # the GPU machines are sm_90: nothing here is its cubin
    run_library(out)


def test_name_expressions_work_from_the_shipped_file(tmp_path):
    src = tmp_path / "axpy.cu"
    src.write_text("template <typename T> __global__ void axpy(T a, const T* x, T* y, int n) {\n"
                   "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }\n")
    out = tmp_path / "axpy.fatbin"
    run_build([src], output=out, archs=[device_sm()],
              name_expressions=["axpy<float>", "axpy<double>"])
    module = kjit.load(str(out))
    for dtype, expr in ((np.float32, "axpy<float>"), (np.float64, "axpy<double>")):
        x, y = np.arange(100, dtype=dtype), np.ones(100, dtype=dtype)
        dy = kjit.to_device(y)
        module.get_function(expr)[1, 128](dtype(2), kjit.to_device(x), dy, 100)
        np.testing.assert_allclose(dy.get(), 2 * x + 1)


RESOURCE_SRC = r'''
extern "C" __global__ void tiled(const float* x, float* y) {
    __shared__ float tile[512];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = tile[(threadIdx.x * 7) % 512];
}
extern "C" __global__ void __launch_bounds__(128) bounded(double* p, int n) {
    double loc[40];
    for (int k = 0; k < 40; ++k) loc[k] = p[k * n];
    double s = 0;
    for (int k = 0; k < 40; ++k) s += loc[(k * 7 + n) % 40];
    p[threadIdx.x] = s;
}
extern "C" __global__ void plain(int* p) { p[threadIdx.x] = 1; }
'''


@pytest.mark.parametrize("max_registers", [None, 32])
def test_nvinfo_agrees_with_cuFuncGetAttribute(tmp_path, max_registers):
    src = tmp_path / "res.cu"
    src.write_text(RESOURCE_SRC)
    out = tmp_path / "res.fatbin"
    run_build([src], output=out, archs=[device_sm()], no_ptx=True,
              options=CompileOptions(max_registers=max_registers))
    [cubin] = entries(out.read_bytes())
    module = kjit.load(ObjectCode(cubin.code))
    for k in kernel_resources(cubin.code):
        attrs = module.get_function(k.name).attributes
        got = (k.registers, k.shared_bytes, k.local_bytes)
        want = (attrs.num_regs, attrs.shared_size_bytes, attrs.local_size_bytes)
        assert got == want, (
            f"{k.name}: nvinfo (registers, shared, local) {got} != driver {want}; "
            f"raw .nv.shared section {k.shared_section_bytes} bytes")
        if k.max_threads is not None:
            assert attrs.max_threads_per_block == k.max_threads


def test_the_example_script_builds_and_runs(tmp_path):
    root = str(LIBRARY.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, str(LIBRARY / "run.py"), "-o", str(tmp_path / "lib.fatbin")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: scale_add, block_sum and block_sum_cub" in r.stdout
