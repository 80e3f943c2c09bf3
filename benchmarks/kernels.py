"""The kernels every toolkit launches, the arguments each passes, and the value each must
leave in out[0]; and cuda.core's side of them (its namespace moved between releases)."""
from __future__ import annotations

from typing import Any


def launch_source(nargs: int) -> str:
    """A kernel with `nargs` parameters (a pointer, then int n, float a, then alternating
    int/float) whose thread 0 writes a checksum of its arguments to out[0]."""
    params = ["float* out"]
    terms = []
    if nargs >= 3:
        params += ["int n", "float a"]
        terms += ["(float)n", "a"]
    for i in range(3, nargs):
        if i % 2:
            params.append(f"int i{i}")
            terms.append(f"(float)i{i}")
        else:
            params.append(f"float f{i}")
            terms.append(f"f{i}")
    body = " + ".join(terms) if terms else "1.0f"
    return (f'extern "C" __global__ void k{nargs}({", ".join(params)}) {{\n'
            f"    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = {body};\n}}\n")


def launch_args(nargs: int) -> list:
    """Python values for the parameters after `out` (same values the C program passes)."""
    vals: list = []
    if nargs >= 3:
        vals += [7, 2.5]
    for i in range(3, nargs):
        vals.append(i if i % 2 else float(i))
    return vals


def numpy_args(nargs: int) -> list:
    """launch_args as exact numpy scalars (int32, float32), as CuPy and cuda.core take them."""
    import numpy as np
    return [np.int32(v) if isinstance(v, int) else np.float32(v) for v in launch_args(nargs)]


def cuda_core() -> Any:
    """cuda.core's namespace: `cuda.core`, or `cuda.core.experimental` in releases before
    its names moved up. ImportError where it is not installed."""
    try:
        import cuda.core as core
        core.Program   # noqa: B018  (the names, not only the package)
    except (ImportError, AttributeError):
        import cuda.core.experimental as core
    return core


def cuda_core_device() -> tuple[Any, Any, str]:
    """(cuda.core's namespace, device 0 made current, its arch as "sm_XY")."""
    core = cuda_core()
    dev = core.Device(0)
    dev.set_current()
    return core, dev, "sm_" + "".join(str(x) for x in dev.compute_capability)


def cuda_core_kernel(nargs: int) -> tuple[Any, Any, Any]:
    """(namespace, device, the nargs-argument kernel compiled by cuda.core for the device)."""
    core, dev, arch = cuda_core_device()
    prog = core.Program(launch_source(nargs), code_type="c++", options=core.ProgramOptions(arch=arch))
    return core, dev, prog.compile("cubin").get_kernel(f"k{nargs}")


def expected(nargs: int) -> float:
    vals = launch_args(nargs)
    return float(sum(vals)) if vals else 1.0


# A kernel as people write them: fp16 loads, a cooperative-groups warp reduction and a CUB
# block reduction. With the toolkit and CCCL headers it reads about 535 headers.
HEADERS_SOURCE = r"""
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cub/block/block_reduce.cuh>
namespace cg = cooperative_groups;

extern "C" __global__ void __launch_bounds__(128) half_sum(const __half* x, float* out, int n) {
    using BlockReduce = cub::BlockReduce<float, 128>;
    __shared__ typename BlockReduce::TempStorage tmp;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? __half2float(x[i]) : 0.0f;
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    v = cg::reduce(warp, v, cg::plus<float>());
    float s = BlockReduce(tmp).Sum(warp.thread_rank() == 0 ? v : 0.0f);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"""
