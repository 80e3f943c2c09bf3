"""Kernels written for nvcc use what its implicit cuda_runtime.h gives them (INFINITY,
FLT_MAX, M_PI, uint...) without an #include: kjit pre-includes the same, with an off switch,
and keys it. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

import kjit
from kjit.cli.main import cli
from kjit.compiler import options as options_mod
from kjit.compiler.cached import compile_key
from kjit.errors import CompileError

# llm.c's softmax_forward_kernel1 / gelu, as written for nvcc: no include at all
SOFTMAX = r'''
#define GELU_SCALING_FACTOR sqrtf(2.0f / M_PI)
extern "C" __global__ void softmax_forward(float* out, const float* inp, int N, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        const float* inp_row = inp + i * C;
        float* out_row = out + i * C;
        float maxval = -INFINITY;
        for (int j = 0; j < C; j++) if (inp_row[j] > maxval) maxval = inp_row[j];
        double sum = 0.0;
        for (int j = 0; j < C; j++) { out_row[j] = expf(inp_row[j] - maxval); sum += out_row[j]; }
        for (int j = 0; j < C; j++) out_row[j] /= (float)sum;
    }
}
extern "C" __global__ void gelu_forward(float* out, const float* inp, uint N) {
    uint i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + cube)));
    }
}
extern "C" __global__ void clamp_max(float* x, int n) {
    float m = -FLT_MAX;
    for (int i = 0; i < n && i < INT_MAX; i++) m = fmaxf(m, x[i]);
    x[0] = m;
}
'''


def ptx(src: str, **opts) -> str:
    return kjit.compile(src, arch="sm_90", target="ptx",
                        options=kjit.CompileOptions(**opts)).code.decode()


def test_llmc_style_kernels_compile_without_includes():
    text = ptx(SOFTMAX)
    assert "0fFF800000" in text            # -INFINITY
    assert "0fFF7FFFFF" in text            # -FLT_MAX
    for name in ("softmax_forward", "gelu_forward", "clamp_max"):
        assert f".entry {name}" in text


def test_uint_with_only_cuda_runtime_h():
    src = '#include <cuda_runtime.h>\nextern "C" __global__ void k(uint* x) { x[threadIdx.x] = 1u; }'
    assert ".entry k" in ptx(src)


@pytest.mark.parametrize("includes", [
    "#include <cmath>\n#include <cfloat>\n#include <climits>\n",
    "#include <math.h>\n#include <float.h>\n#include <limits.h>\n",
    "#include <cuda/std/cmath>\n#include <cuda/std/cfloat>\n#include <cuda/std/climits>\n",
    "#include <cub/block/block_reduce.cuh>\n#include <cooperative_groups/reduce.h>\n",
])
def test_headers_that_define_the_same_names_compile_without_warnings(includes):
    src = includes + r'''
    __device__ float pass(const float& v) { return v; }     // binds a reference: ODR-use
    extern "C" __global__ void k(float* x) {
        constexpr float lo = -INFINITY;
        x[0] = fmaxf(x[0], lo) + pass(INFINITY) + (isnan(NAN) ? 1.f : 0.f) + (float)HUGE_VAL
             + FLT_MAX + (float)M_PI + (float)INT_MAX;
    }'''
    obj = kjit.compile(src, arch="sm_90", target="ptx", cache=False)
    assert "warning" not in (obj.log or ""), obj.log


def test_the_prelude_can_be_switched_off():
    with pytest.raises(CompileError, match="INFINITY"):
        ptx(SOFTMAX, nvcc_prelude=False)
    a = compile_key(SOFTMAX, arch="sm_90")
    b = compile_key(SOFTMAX, arch="sm_90", options=kjit.CompileOptions(nvcc_prelude=False))
    assert a != b


def test_the_key_covers_the_preludes_text(monkeypatch):
    before = compile_key(SOFTMAX, arch="sm_90")
    text = options_mod.prelude_text()
    monkeypatch.setattr(options_mod, "_prelude", [text + "\n#define KJIT_CHANGED 1\n", "another digest"])
    assert compile_key(SOFTMAX, arch="sm_90") != before


def test_cli_switch(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(SOFTMAX)
    ok = CliRunner().invoke(cli, ["compile", str(src), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin")])
    assert ok.exit_code == 0, ok.output
    off = CliRunner().invoke(cli, ["compile", str(src), "--arch", "sm_90", "--no-nvcc-prelude",
                                   "-o", str(tmp_path / "k2.cubin")])
    assert off.exit_code == 1 and "INFINITY" in off.output


@pytest.mark.parametrize("std", ["c++03", "c++11", "c++14", "c++17", "c++20"])
def test_every_dialect(std):
    src = ('extern "C" __global__ void k(float* x, uint n) {\n'
           '    x[0] = fmaxf(x[1], -INFINITY) + (float)M_PI + FLT_MAX + (isnan(NAN) ? 1.f : 0.f); }\n')
    assert "0fFF800000" in ptx(src, std=std)
