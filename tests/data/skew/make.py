"""Regenerate the data of tests/test_skew_gpu.py with the installed NVRTC. NVRTC 13.5 emits
PTX .version 9.5, newer than the CUDA 13.0 driver of the GPU machines accepts:
    python tests/data/skew/make.py"""
from pathlib import Path

import kjit
from kjit.build.pack import make_fatbin

HERE = Path(__file__).parent
SRC = r'''
extern "C" __global__ void cube(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * x[i] * x[i];
}'''

if __name__ == "__main__":
    ptx = kjit.compile(SRC, arch="compute_80", target="ptx", cache=False, name="cube.cu")
    (HERE / "cube.ptx").write_bytes(ptx.code)
    make_fatbin([ptx]).save(HERE / "cube-ptx-only.fatbin")
    print(ptx.ptx_version)
