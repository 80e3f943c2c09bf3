"""The kernels every toolkit launches, and the value each must leave in out[0]."""
from __future__ import annotations


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


def expected(nargs: int) -> float:
    vals = launch_args(nargs)
    return float(sum(vals)) if vals else 1.0
