"""Conformance with PyCUDA's SourceModule tests.

Upstream: inducer/pycuda, commit 00603c3ebda1d85b4b42f7b5839b543066842b86,
test/test_driver.py, class TestDriver: test_simple_kernel, test_simple_kernel_2,
test_vector_types, test_streamed_kernel, test_large_smem, test_prepared_invocation,
test_prepared_with_vector, test_constant_memory, test_recursive_launch,
test_jit_link_module; the texture tests (test_2d_texture ... test_3d_fp_surfaces) have no
kjit counterpart (tests/conformance/README.md says why) beyond the compile error below.

PyCUDA wraps every SourceModule in `extern "C" {}` unless told not to, so its users write
plain `__global__` kernels and fetch them by their plain names; the first tests here do
that. The kernels are kjit's own, written in PyCUDA's style.
"""
from __future__ import annotations

import numpy as np
import pytest

import kjit
from kjit.errors import CompileError

ARCH = "sm_90"
gpu = pytest.mark.gpu
rng = np.random.default_rng()
RDC = kjit.CompileOptions(relocatable=True)

# no extern "C": what a PyCUDA user brings
PRODUCT = r'''
__global__ void elementwise_product(float *dest, float *a, float *b)
{
  const int i = threadIdx.x;
  dest[i] = a[i] * b[i];
}
'''

PRODUCT_2D = r'''
extern "C" __global__ void product_2d(float *dest, const float *a, const float *b)
{
  const int i = threadIdx.x * blockDim.y + threadIdx.y;
  dest[i] = a[i] * b[i];
}
'''

BROADCAST_VECTOR = r'''
extern "C" __global__ void broadcast3(float3 *dest, float3 v)
{
  dest[threadIdx.x] = v;
}
extern "C" __global__ void spread3(double *dest, double3 v)
{
  dest[3 * threadIdx.x] = v.x; dest[3 * threadIdx.x + 1] = v.y; dest[3 * threadIdx.x + 2] = v.z;
}
'''

BIG_SHARED = r'''
extern "C" __global__ void through_shared(int *out)
{
  __shared__ int stash[%d];
  stash[threadIdx.x] = threadIdx.x * 3;
  __syncthreads();
  out[threadIdx.x] = stash[blockDim.x - 1 - threadIdx.x];
}
'''

DOUBLE_IN_PLACE = r'''
extern "C" __global__ void doubled(float *a)
{
  extern __shared__ float unused_dynamic[];
  int i = threadIdx.x + threadIdx.y * blockDim.x;
  a[i] *= 2;
}
'''

CONSTANT_COPY = r'''
__constant__ float table[32];

extern "C" __global__ void from_table(float *out)
{
  out[threadIdx.x] = table[threadIdx.x];
}
'''

# a parent kernel launching a child from the device and calling device functions
NESTED = r'''
__device__ long long plus_one_sum(long long p, long long q) { return p + 1 + q; }

__global__ void twice_minus(long long *p, const long long *q, long long *d)
{
  int t = threadIdx.x;
  p[t] = 2 * p[t];
  d[t] = p[t] - q[t];
}

extern "C" __global__ void parent(long long *a, const long long *b, long long *c, long long *d)
{
  int t = threadIdx.x;
  c[t] = plus_one_sum(a[t], b[t]);
  __syncthreads();
  if (t == 0) twice_minus<<<1, blockDim.x>>>(a, b, d);
}
'''

# separate compilation: the outer kernel launches a kernel defined in another source
OUTER = r'''
__global__ void outer_mark(int *flags)
{
  extern __global__ void inner_mark(int *flags);
  flags[blockIdx.x] = 1;
  inner_mark<<<2, 1>>>(flags + 2 + 2 * blockIdx.x);
}
'''
INNER = r'''
__global__ void inner_mark(int *flags)
{
  flags[blockIdx.x] = 7;
}
'''

TEXTURE_REFERENCE = r'''
texture<float, 2, cudaReadModeElementType> grid_tex;
extern "C" __global__ void sample(float *dest)
{
  dest[threadIdx.x * blockDim.y + threadIdx.y] = tex2D(grid_tex, threadIdx.x, threadIdx.y);
}
'''


# --- CPU ----------------------------------------------------------------------------------

def test_plain_global_kernel_is_a_mangled_entry_point():
    """test_simple_kernel, the compile half: without extern "C" the symbol is C++-mangled;
    the entry points list it so (the GPU test fetches it by its plain name)."""
    obj = kjit.compile(PRODUCT, arch=ARCH)
    assert obj.entry_points == ("_Z19elementwise_productPfS_S_",)


def test_device_launch_links_with_the_device_runtime():
    """test_recursive_launch (DynamicSourceModule): -rdc plus cudadevrt."""
    linked = kjit.link([kjit.compile(NESTED, arch=ARCH, options=RDC)], arch=ARCH)
    assert linked.device_runtime
    assert "parent" in linked.object.entry_points


def test_two_relocatable_sources_link_into_one_module():
    """test_jit_link_module (DynamicModule.add_source twice, add_stdlib('cudadevrt'), link)."""
    outer = kjit.compile(OUTER, arch=ARCH, options=RDC, name="outer.cu")
    inner = kjit.compile(INNER, arch=ARCH, options=RDC, name="inner.cu")
    linked = kjit.link([outer, inner], arch=ARCH)
    assert {"_Z10outer_markPi", "_Z10inner_markPi"} <= set(linked.object.entry_points)
    assert linked.device_runtime


def test_texture_references_are_a_compile_error_naming_them():
    """The texture tests: texture references left CUDA 12; NVRTC's error names them."""
    with pytest.raises(CompileError) as err:
        kjit.compile(TEXTURE_REFERENCE, arch=ARCH)
    assert "texture" in err.value.log


# --- GPU ----------------------------------------------------------------------------------

@gpu
def test_plain_kernel_by_plain_name_with_in_and_out_host_arrays():
    """test_simple_kernel: get_function('name') of a kernel without extern "C", launched with
    drv.Out / drv.In host arrays (kjit.Out / kjit.In) and block=(400, 1, 1)."""
    a = rng.standard_normal(400).astype(np.float32)
    b = rng.standard_normal(400).astype(np.float32)
    dest = np.zeros_like(a)
    k = kjit.load(kjit.compile(PRODUCT)).get_function("elementwise_product")
    k[1, (400, 1, 1)](kjit.Out(dest), kjit.In(a), kjit.In(b))
    np.testing.assert_array_equal(dest, a * b)


@gpu
def test_device_arrays_and_pointer_offsets():
    """test_simple_kernel_2: device arrays, then a pointer one element in (np.intp(a) + 4)."""
    a = rng.standard_normal(400).astype(np.float32)
    b = rng.standard_normal(400).astype(np.float32)
    da, db = kjit.to_device(a), kjit.to_device(b)
    k = kjit.load(kjit.compile(PRODUCT)).get_function("elementwise_product")
    dest = np.zeros_like(a)
    k[1, 400](kjit.Out(dest), da, db)
    np.testing.assert_array_equal(dest, a * b)
    dest = np.zeros_like(a)
    k[1, 399](kjit.Out(dest), kjit.ptr(da.ptr + a.itemsize), db)
    np.testing.assert_array_equal(dest[:-1], a[1:] * b[:-1])


@gpu
def test_vector_type_by_value_from_a_tuple_or_a_record():
    """test_vector_types / test_prepared_with_vector: a float3 by value, from a tuple or a
    numpy record (gpuarray.vec.make_float3 gives one); float3* from a float32 array."""
    mod = kjit.load(kjit.compile(BROADCAST_VECTOR))
    k = mod.get_function("broadcast3")
    float3 = np.dtype([("x", np.float32), ("y", np.float32), ("z", np.float32)])
    for value in ((1.0, 2.0, 3.0), np.array((1.0, 2.0, 3.0), dtype=float3)[()]):
        dest = kjit.zeros(3 * 400, np.float32)
        k[1, 400](dest, value)
        np.testing.assert_array_equal(dest.get().reshape(400, 3), np.tile([1, 2, 3], (400, 1)))


@gpu
def test_double3_from_a_one_element_record_array():
    """A record array of one element for a double3 parameter (what np.array([...], dtype)
    gives), as CuPy and PyCUDA users pass it."""
    double3 = np.dtype([("x", np.float64), ("y", np.float64), ("z", np.float64)])
    k = kjit.load(kjit.compile(BROADCAST_VECTOR)).get_function("spread3")
    dest = kjit.zeros(3 * 8, np.float64)
    k[1, 8](dest, np.array([(0.5, -1.0, 2.5)], dtype=double3))
    np.testing.assert_array_equal(dest.get().reshape(8, 3), np.tile([0.5, -1.0, 2.5], (8, 1)))


@gpu
def test_kernel_on_a_stream_with_a_2d_block():
    """test_streamed_kernel: block=(32, 8, 1) and stream=strm."""
    shape = (32, 8)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    stream = kjit.Stream()
    k = kjit.load(kjit.compile(PRODUCT_2D)).get_function("product_2d")
    dest = kjit.zeros(shape, np.float32)
    k[1, shape + (1,), stream, 0](dest, kjit.to_device(a), kjit.to_device(b))
    stream.synchronize()
    np.testing.assert_array_equal(dest.get(), a * b)


@gpu
def test_large_static_shared_memory():
    """test_large_smem: __shared__ int [4000]; the attribute reports it."""
    n = 4000
    k = kjit.load(kjit.compile(BIG_SHARED % n)).get_function("through_shared")
    assert k.attributes.shared_size_bytes == n * 4
    out = kjit.zeros(1000, np.int32)
    k[1, 1000](out)
    np.testing.assert_array_equal(out.get(), 3 * np.arange(999, -1, -1, dtype=np.int32))


@gpu
def test_dynamic_shared_size_and_offset_pointer():
    """test_prepared_invocation: prepared_call((1, 1), (4, 4, 1), a, shared_size=20), then
    a pointer one element in."""
    a = rng.standard_normal((4, 4)).astype(np.float32)
    da = kjit.to_device(a)
    k = kjit.load(kjit.compile(DOUBLE_IN_PLACE)).get_function("doubled")
    k[(1, 1), (4, 4, 1), None, 20](da)
    np.testing.assert_array_equal(da.get(), 2 * a)
    k[(1, 1), (15, 1, 1)](kjit.ptr(da.ptr + a.itemsize))
    quadrupled = da.get().ravel()
    np.testing.assert_array_equal(quadrupled[1:], 4 * a.ravel()[1:])
    assert quadrupled[0] == 2 * a.ravel()[0]


@gpu
def test_constant_memory():
    """test_constant_memory: module.get_global('const_array') then memcpy_htod."""
    mod = kjit.load(kjit.compile(CONSTANT_COPY))
    host = rng.integers(0, 255, 32).astype(np.float32)
    mod.get_global("table").copy_from_host(host)
    out = kjit.zeros(32, np.float32)
    mod.get_function("from_table")[(1, 1), (32, 1, 1)](out)
    np.testing.assert_array_equal(out.get(), host)


@gpu
def test_recursive_launch():
    """test_recursive_launch: a parent kernel calling device functions and launching a child."""
    n = 100
    a = rng.integers(0, 10, n).astype(np.int64)
    b = rng.integers(0, 10, n).astype(np.int64)
    k = kjit.load(kjit.link([kjit.compile(NESTED, options=RDC)])).get_function("parent")
    da, db = kjit.to_device(a), kjit.to_device(b)
    c, d = kjit.zeros(n, np.int64), kjit.zeros(n, np.int64)
    k[1, n](da, db, c, d)
    np.testing.assert_array_equal(c.get(), a + 1 + b)
    np.testing.assert_array_equal(da.get(), 2 * a)
    np.testing.assert_array_equal(d.get(), 2 * a - b)


@gpu
def test_jit_linked_module_by_plain_name():
    """test_jit_link_module: two -rdc sources linked with cudadevrt, the outer kernel fetched
    by its plain name."""
    outer = kjit.compile(OUTER, options=RDC, name="outer.cu")
    inner = kjit.compile(INNER, options=RDC, name="inner.cu")
    k = kjit.load(kjit.link([outer, inner])).get_function("outer_mark")
    flags = kjit.zeros(6, np.int32)
    k[(2, 1), (1, 1, 1)](flags)
    np.testing.assert_array_equal(flags.get(), [1, 1, 7, 7, 7, 7])
