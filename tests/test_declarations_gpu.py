"""Kernels declared as CuPy's tests declare them, launched: their parameters typed from the
source as the compiler reads it, so a Python int, a Python complex, a NumPy record arrive as
the kernel's C types.

The kernels are written for these tests after the styles of cupy/cupy, commit
00f8572fe65269fa6c3e535c9fc71b1f42404de1, tests/cupy_tests/core_tests/test_raw.py
(`_test_source2`: an `extern "C"` block with line splices; `_test_source3`: the type chosen
by `-DPRECISION`; `_test_cuComplex`: `test_add_scalar`, `test_addf_scalar`).
"""
from __future__ import annotations

import numpy as np
import pytest

import kjit

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

SPLICED = r'''
extern "C"{

__global__ void add(const float* x1, const float* x2, float* y, \
                    unsigned int N)
{
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < N) y[tid] = x1[tid] + x2[tid];
}

__global__ void mul(const float* x1, const float* x2, float* y, \
                    unsigned int N)
{
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < N) y[tid] = x1[tid] * x2[tid];
}

}
'''


def test_a_line_spliced_extern_c_block_takes_a_python_int():
    mod = kjit.load(kjit.compile(SPLICED))
    n = 1000
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x1, x2, y = kjit.to_device(a), kjit.to_device(b), kjit.zeros(n, np.float32)
    for name, want in (("add", a + b), ("mul", a * b)):
        k = mod.get_function(name)
        assert [p.ctype.name for p in k.params][-1] == "unsigned int"
        k[kjit.cdiv(n, 128), 128](x1, x2, y, n)
        np.testing.assert_array_equal(y.get(), want)
    with pytest.raises(kjit.ArgumentError, match="'x1'.*float64"):
        mod.get_function("add")[1, 1](kjit.zeros(n, np.float64), x2, y, n)


PRECISION = r'''
#ifndef PRECISION
    #define PRECISION 2
#endif
#if PRECISION == 2
    #define TYPE double
#elif PRECISION == 1
    #define TYPE float
#else
    #error precision not supported
#endif
extern "C" __global__ void add(const TYPE* x1, TYPE* y, \
                               unsigned int N)
{
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < N) y[tid] += x1[tid];
}
'''


@pytest.mark.parametrize("precision, dtype", [("1", np.float32), ("2", np.float64)])
def test_the_type_a_define_picks_is_the_type_checked(precision, dtype):
    obj = kjit.compile(PRECISION, options=kjit.CompileOptions(defines={"PRECISION": precision}))
    k = kjit.load(obj).get_function("add")
    assert k.params[0].ctype.typestr == np.dtype(dtype).str
    n = 300
    a = rng.standard_normal(n).astype(dtype)
    y = kjit.zeros(n, dtype)
    k[kjit.cdiv(n, 128), 128](kjit.to_device(a), y, n)
    np.testing.assert_array_equal(y.get(), a)
    other = np.float64 if dtype is np.float32 else np.float32
    with pytest.raises(kjit.ArgumentError, match="'x1'"):
        k[1, 1](kjit.zeros(n, other), y, n)


COMPLEX = r'''
#include <cuComplex.h>
#include <cuda/std/complex>
extern "C" {
__global__ void add_scalar(const cuDoubleComplex* arr, cuDoubleComplex scalar,
                           cuDoubleComplex* out, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = cuCadd(arr[i], scalar);
}
__global__ void addf_scalar(const cuComplex* arr, cuComplex scalar, cuComplex* out, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = cuCaddf(arr[i], scalar);
}
__global__ void scale(char tag, cuda::std::complex<double> z, cuda::std::complex<float> w,
                      cuda::std::complex<double>* out, cuda::std::complex<float>* outf) {
    out[0] = z * 2.0;
    outf[0] = w * 2.0f + cuda::std::complex<float>(tag, 0);
}
}
'''


def test_complex_scalars_and_arrays_arrive_as_the_kernel_s_complex_types():
    mod = kjit.load(kjit.compile(COMPLEX))
    n = 257
    for name, dtype in (("add_scalar", np.complex128), ("addf_scalar", np.complex64)):
        host = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
        out = kjit.zeros(n, dtype)
        s = complex(rng.standard_normal(), rng.standard_normal())
        k = mod.get_function(name)
        for scalar in (s, dtype(s)):
            k[kjit.cdiv(n, 128), 128](kjit.to_device(host), scalar, out, n)
            np.testing.assert_allclose(out.get(), host + dtype(s), rtol=1e-6)
        with pytest.raises(kjit.ArgumentError, match="'scalar'.*expected a complex number"):
            k[1, 1](kjit.to_device(host), 1.5, out, n)
    out, outf = kjit.zeros(1, np.complex128), kjit.zeros(1, np.complex64)
    z = complex(1 / 3, -2e300)   # beyond float: double precision all the way
    mod.get_function("scale")[1, 1](5, z, np.complex64(0.25 - 1j), out, outf)
    assert out.get()[0] == z * 2
    assert outf.get()[0] == np.complex64(5.5 - 2j)


RECORDS = r'''
struct S { float a; int c[2]; double d; };
extern "C" __global__ void unpack(S s, double3 v, double* out) {
    out[0] = s.a; out[1] = s.c[0]; out[2] = s.c[1]; out[3] = s.d;
    out[4] = v.x; out[5] = v.y; out[6] = v.z;
}
'''


def test_records_with_sub_arrays_and_one_element_record_arrays_arrive_whole():
    k = kjit.load(kjit.compile(RECORDS)).get_function("unpack")
    out = kjit.zeros(7, np.float64)
    named = np.zeros(1, np.dtype([("a", "f4"), ("c", "i4", (2,)), ("d", "f8")], align=True))
    named[0] = (1.5, (3, -4), 2.5)
    by_layout = np.zeros(1, np.dtype({"names": ["p", "q", "r"], "formats": ["f4", ("i4", (2,)), "f8"],
                                      "offsets": [0, 4, 16], "itemsize": 24}))
    by_layout[0] = (1.5, (3, -4), 2.5)
    v = np.array([(7.0, 8.0, 9.0)], [("x", "f8"), ("y", "f8"), ("z", "f8")])
    for s, v3 in ((named[0], v), (named, v[0]), (by_layout[0], v)):
        k[1, 1](s, v3, out)
        np.testing.assert_array_equal(out.get(), [1.5, 3, -4, 2.5, 7, 8, 9])
