"""Load and launch on a real GPU: every check compares with numpy on fresh random inputs."""
from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kjit
from kjit.errors import ArgumentError, DriverError, KernelNotFoundError
from cupy_family import import_cupy

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''


@kjit.kernel
def saxpy():
    return SAXPY


def test_decorator_saxpy_float_arrives_as_float():
    n = 10_001
    xh = rng.standard_normal(n).astype(np.float32)
    yh = rng.standard_normal(n).astype(np.float32)
    x, y = kjit.to_device(xh), kjit.to_device(yh)
    saxpy[kjit.cdiv(n, 256), 256](2.5, x, y, n)
    np.testing.assert_allclose(y.get(), 2.5 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-7)  # FMA on the GPU


@kjit.kernel(options=kjit.CompileOptions(fast_math=False))
def scale(T="float", FACTOR=3):
    return f'''
    extern "C" __global__ void scale({T}* out, const {T}* in, int n) {{
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = in[i] * ({T}){FACTOR};
    }}'''


def test_specialize_compiles_each_specialization_once():
    n = 777
    for T, dt in (("float", np.float32), ("double", np.float64)):
        k = scale.specialize(T=T, FACTOR=5)
        assert k is scale.specialize(T=T, FACTOR=5)
        src = rng.standard_normal(n).astype(dt)
        out = kjit.empty(n, dt)
        k[kjit.cdiv(n, 128), 128](out, kjit.to_device(src), n)
        np.testing.assert_allclose(out.get(), src * 5, rtol=1e-6)
    with pytest.raises(ArgumentError, match="float64"):   # double array into the float kernel
        scale[1, 32](kjit.empty(4, np.float64), kjit.empty(4, np.float64), 4)


def test_load_with_jit_options_logs_attributes_and_occupancy():
    # a tag unique to this run keeps the driver's JIT cache from answering without a log
    tag = int(rng.integers(1, 2**31))
    src = SAXPY + f"\n__device__ int kjit_test_tag = {tag};\n"
    obj = kjit.compile(src, target="ptx", arch=f"compute_{kjit.Device(0).arch[3:]}")
    mod = kjit.load(obj, jit_options=kjit.JitOptions(max_registers=32, optimization_level=3,
                                                     log_verbose=True, generate_line_info=True))
    assert mod.jit_wall_time_ms > 0
    assert "saxpy" in mod.info_log and "registers" in mod.info_log, mod.info_log
    k = mod.get_function("saxpy")
    assert 0 < k.attributes.num_regs <= 32
    assert k.attributes.max_threads_per_block >= 256
    assert k.max_active_blocks(256) >= 1
    min_grid, block = k.suggested_block_size()
    assert min_grid > 0 and 32 <= block <= 1024
    with pytest.raises(KernelNotFoundError, match="saxpy"):
        mod.get_function("saxpy_typo")


def test_jit_error_log_is_captured():
    ptx = kjit.compile(SAXPY, target="ptx", arch=f"compute_{kjit.Device(0).arch[3:]}")
    broken = kjit.ObjectCode(ptx.code.replace(b"ret;", b"ret_typo;"), kind="ptx")
    with pytest.raises(DriverError) as err:
        kjit.load(broken)
    assert err.value.cuda_name == "CUDA_ERROR_INVALID_PTX"
    assert "ret_typo" in str(err.value)   # the JIT's own error log, not just the code


def test_default_compile_target_is_the_device_cubin():
    obj = kjit.compile(SAXPY)
    assert obj.kind == "cubin" and obj.arch == kjit.Device(0).arch


def test_globals_and_constant_memory():
    src = r'''
    __constant__ float coeffs[16];
    __device__ int counter;
    extern "C" __global__ void poly(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) { float acc = 0.f; for (int k = 15; k >= 0; --k) acc = acc * x[i] + coeffs[k]; y[i] = acc; }
        if (i == 0) counter = 42;
    }'''
    mod = kjit.load(kjit.compile(src))
    c = rng.standard_normal(16).astype(np.float32)
    g = mod.get_global("coeffs")
    assert g.nbytes == 64
    g.copy_from_host(c)
    np.testing.assert_array_equal(g.copy_to_host(np.float32), c)
    with pytest.raises(ArgumentError):
        g.copy_from_host(np.ones(8, np.float32))
    n = 1000
    xh = rng.uniform(-1, 1, n).astype(np.float32)
    y = kjit.empty(n, np.float32)
    mod.get_function("poly")[kjit.cdiv(n, 256), 256](kjit.to_device(xh), y, n)
    np.testing.assert_allclose(y.get(), np.polyval(c[::-1].astype(np.float64), xh), rtol=1e-4, atol=1e-4)
    assert mod.get_global("counter").copy_to_host(np.int32)[0] == 42


def test_name_expressions_and_mangled_types():
    src = r'''
    template <typename T>
    __global__ void axpy(T a, const T* x, T* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }'''
    obj = kjit.compile(src, name_expressions=["axpy<float>", "axpy<double>"])
    mod = kjit.load(obj)
    n = 333
    for expr, dt in (("axpy<float>", np.float32), ("axpy<double>", np.float64)):
        k = mod.get_function(expr)
        assert [s.ctype.name for s in k.params] == [dt.__name__ if False else
                                                      ("float" if dt is np.float32 else "double"),
                                                      f"const {'float' if dt is np.float32 else 'double'}*",
                                                      f"{'float' if dt is np.float32 else 'double'}*", "int"]
        xh, yh = rng.standard_normal(n).astype(dt), rng.standard_normal(n).astype(dt)
        y = kjit.to_device(yh)
        k[2, 256](0.5, kjit.to_device(xh), y, n)
        np.testing.assert_allclose(y.get(), 0.5 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-7)


SEED002 = r'''
extern "C" __global__ void params(int i, float4 f4, char c, float f, float* out, float2 f2) {
    out[0] = (float)i; out[1] = f4.x; out[2] = f4.y; out[3] = f4.z; out[4] = f4.w;
    out[5] = (float)c; out[6] = f; out[7] = f2.x; out[8] = f2.y;
}'''


def test_seed002_parameter_buffer_layout():
    k = kjit.load(kjit.compile(SEED002)).get_function("params")
    assert [s.offset for s in k.params] == [0, 16, 32, 36, 40, 48]
    vals = rng.standard_normal(7).astype(np.float32)
    out = kjit.zeros(9, np.float32)
    k[1, 1](-7, tuple(vals[:4]), 65, float(vals[4]), out, (vals[5], vals[6]))
    np.testing.assert_array_equal(out.get(), np.array([-7, *vals[:4], 65, vals[4], vals[5], vals[6]], np.float32))


MIXED = r'''
extern "C" __global__ void mixed(signed char a, double b, short c, unsigned long long d, float e,
                                 unsigned char f, long long g, float* out, unsigned short h, int i,
                                 signed char j) {
    out[0] = a; out[1] = (float)b; out[2] = c; out[3] = (float)d; out[4] = e; out[5] = f;
    out[6] = (float)g; out[7] = h; out[8] = i; out[9] = j;
}'''


def test_scalars_of_every_size_arrive_through_the_parameter_block():
    # C launchers hand the driver the packed buffer whole (CU_LAUNCH_PARAM_BUFFER_POINTER),
    # laid out as cuFuncGetParamInfo says: padding between sizes 1, 2, 4 and 8 must match, and
    # the block ends with its last parameter (65 bytes here, not rounded up to 8)
    k = kjit.load(kjit.compile(MIXED)).get_function("mixed")
    assert k.block_size == k.params[-1].offset + k.params[-1].size == 65
    out = kjit.zeros(10, np.float32)
    for grid, vals in ((1, (-5, 2.5, -300, 2**40, 1.25, 200, -2**33, 60000, -7, -3)),
                       (2, (7, -0.5, 12, 3, -8.0, 1, 5, 2, 2**30, 100))):   # the block rewritten
        run = k[grid, 1]
        assert type(getattr(run, "__self__", None)).__name__ == "Launcher"
        run(*vals[:7], out, *vals[7:])
        np.testing.assert_array_equal(out.get(), np.array(vals, np.float32))



ROWS = r'''
extern "C" __global__ void rows(float* out, int row, int a, float b, double c) {
    out[3 * row] = (float)a; out[3 * row + 1] = b; out[3 * row + 2] = (float)c;
}'''


def test_each_launch_gets_its_own_scalars_whatever_ran_between():
    # a C launcher keeps the int or float object it wrote into its buffer last and does not
    # convert the very same object again: what other launchers of the kernel, the Python path
    # (a numpy scalar) and a refused launch write in between must not leave it stale
    k = kjit.load(kjit.compile(ROWS)).get_function("rows")
    out = kjit.zeros(3 * 9, np.float32)
    a, b, c = 12345678, 1.5, 2.25
    L, other = k[1, 1], k[2, 1]
    assert {type(getattr(run, "__self__", None)).__name__ for run in (L, other)} == {"Launcher"}
    expect = []
    for row, run, args in ((0, L, (a, b, c)), (1, L, (a, b, c)), (2, other, (7, -1.0, 3.0)),
                           (3, L, (a, b, c)), (4, L, (np.int32(99), b, c)), (5, L, (a, b, c)),
                           (6, L, (int("12345670") + 1, float("0.25") * 5, c)), (7, other, (a, b, c))):
        run(out, row, *args)
        expect.append(args)
    with pytest.raises(ArgumentError, match="'b'"):
        L(out, 8, -4, "x", c)   # refused after writing the slots before b
    L(out, 8, a, b, -c)
    expect.append((a, b, -c))
    np.testing.assert_array_equal(out.get(), np.array(expect, np.float32).ravel())


STRUCT_SRC = r'''
typedef struct { float f; float4 f4; } myStruct;
extern "C" __global__ void unpack(myStruct s, float* out) {
    out[0] = s.f; out[1] = s.f4.x; out[2] = s.f4.y; out[3] = s.f4.z; out[4] = s.f4.w;
}'''


class Float4(ctypes.Structure):
    _fields_ = [("x", ctypes.c_float), ("y", ctypes.c_float), ("z", ctypes.c_float), ("w", ctypes.c_float)]


class HostStruct(ctypes.Structure):   # host layout: f4 at offset 4, size 20
    _fields_ = [("f", ctypes.c_float), ("f4", Float4)]


def test_struct_whose_host_and_device_layouts_differ():
    k = kjit.load(kjit.compile(STRUCT_SRC)).get_function("unpack")
    assert k.params[0].size == 32          # device: f4 aligned to 16
    assert ctypes.sizeof(HostStruct) == 20
    v = rng.standard_normal(5).astype(np.float32)
    expect = v.copy()
    out = kjit.zeros(5, np.float32)
    k[1, 1](HostStruct(v[0], Float4(*v[1:])), out)
    np.testing.assert_array_equal(out.get(), expect)
    host_dt = np.dtype([("f", np.float32), ("f4", [("x", "f4"), ("y", "f4"), ("z", "f4"), ("w", "f4")])])
    rec = np.zeros((), host_dt)
    rec["f"], rec["f4"] = v[0], tuple(v[1:])
    out2 = kjit.zeros(5, np.float32)
    k[1, 1](rec, out2)
    np.testing.assert_array_equal(out2.get(), expect)
    out3 = kjit.zeros(5, np.float32)
    k[1, 1]({"f": v[0], "f4": tuple(v[1:])}, out3)
    np.testing.assert_array_equal(out3.get(), expect)


def test_argument_errors_before_launch():
    n = 64
    x, y = kjit.to_device(rng.standard_normal(n).astype(np.float32)), kjit.zeros(n, np.float32)
    launch = saxpy[1, 64]
    with pytest.raises(ArgumentError, match="host numpy array"):
        launch(1.0, np.ones(n, np.float32), y, n)
    with pytest.raises(ArgumentError, match="takes 4 arguments"):
        launch(1.0, x, y)
    with pytest.raises(ArgumentError, match="float64"):
        launch(1.0, kjit.zeros(n, np.float64), y, n)
    with pytest.raises(ArgumentError, match="does not fit"):
        launch(1.0, x, y, 2**40)
    with pytest.raises(ArgumentError, match="expected an integer"):
        launch(1.0, x, y, 64.0)
    with pytest.raises(ArgumentError, match="overflows"):
        launch(1e300, x, y, n)
    with pytest.raises(ArgumentError, match="kjit.ptr"):
        launch(1.0, x.ptr, y, n)
    with pytest.raises(ArgumentError, match="cannot be represented exactly"):
        launch(2**24 + 1, x, y, n)
    np.testing.assert_array_equal(y.get(), np.zeros(n, np.float32))  # nothing was launched


def test_raw_pointer_and_numpy_scalars():
    n = 100
    xh, yh = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x, y = kjit.to_device(xh), kjit.to_device(yh)
    saxpy[1, 128](np.float32(3.0), kjit.ptr(x.ptr), y, np.int64(n))
    np.testing.assert_allclose(y.get(), 3.0 * xh.astype(np.float64) + yh, rtol=1e-6, atol=1e-7)


def test_launch_from_worker_thread_without_context():
    n = 4096
    xh = rng.standard_normal(n).astype(np.float32)
    x, y = kjit.to_device(xh), kjit.zeros(n, np.float32)
    errors = []

    def work():
        try:
            saxpy[kjit.cdiv(n, 256), 256](1.0, x, y, n)
            kjit.synchronize()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    np.testing.assert_allclose(y.get(), xh)


def test_device_and_explicit_context():
    with kjit.Device(0) as dev:
        assert dev.arch.startswith("sm_")
    ctx = kjit.Context(0)
    try:
        with ctx:
            mod = kjit.load(kjit.compile(SAXPY))
            n = 50
            xh = rng.standard_normal(n).astype(np.float32)
            x, y = kjit.to_device(xh), kjit.zeros(n, np.float32)
            mod.get_function("saxpy")[1, 64](1.5, x, y, n)
            np.testing.assert_allclose(y.get(), 1.5 * xh, rtol=1e-6)
    finally:
        ctx.close()


def test_a_kernel_function_launches_in_each_new_context_made_where_a_closed_one_was():
    # f[grid, block] remembers the Kernel it found for the current context; a context closed
    # and another made (often at the same address) must get a Kernel loaded there
    @kjit.kernel
    def put():
        return 'extern "C" __global__ void put(int* out, int v) { out[threadIdx.x] = v; }'

    for v in (1, 2, 3):
        ctx = kjit.Context(0)
        try:
            with ctx:
                out = kjit.zeros(4, np.int32)
                put[1, 4](out, 0)
                put[1, 4](out, v)
                np.testing.assert_array_equal(out.get(), [v] * 4)
                assert put.kernel().context_address == int(ctx.handle)
        finally:
            ctx.close()


def test_a_kernel_kept_after_its_context_is_closed_runs_in_the_context_current_now():
    # Closing a kjit.Context kills the kernels loaded in it, and the driver may put the next
    # context at the same address. A launch of such a kernel, or of a launcher held from it,
    # runs the module's kernel loaded in the context current now: never the dead handle.
    src = r'''extern "C" __global__ void put(int* out, int v) { out[threadIdx.x] = v; }'''
    obj = kjit.compile(src)
    first = kjit.Context(0)
    with first:
        k = kjit.load(obj).get_function("put")
        held = k[1, 4]
        out = kjit.zeros(4, np.int32)
        held(out, 1)
        np.testing.assert_array_equal(out.get(), [1] * 4)
    address = int(first.handle)
    first.close()
    again = kjit.Context(0)
    for _ in range(8):   # the case that matters: a new context at the old address
        if int(again.handle) == address:
            break
        again.close()
        again = kjit.Context(0)
    try:
        with again:
            out = kjit.zeros(4, np.int32)
            for v, launch in enumerate([held, k[1, 4], lambda *a: k.launch(1, 4, *a)], start=2):
                launch(out, v)
                np.testing.assert_array_equal(out.get(), [v] * 4)
            assert k._in_current_context() is not k   # the module was loaded again here
    finally:
        again.close()


def test_a_launcher_runs_in_its_kernels_context_whatever_context_is_current():
    # A C launcher launches first and asks which context is current only where the driver
    # refuses (its kernel's function on another context's legacy stream: nothing runs, no
    # error stays). With another context current, or none, a launch whose arrays live in the
    # kernel's context must run there, and leave the thread's current context as it was.
    from kjit import driver
    from kjit.runtime.libcuda import current_context
    src = r'''extern "C" __global__ void put(int* out, int v) { out[threadIdx.x] = v; }'''
    k = kjit.load(kjit.compile(src)).get_function("put")
    out, stream = kjit.zeros(4, np.int32), kjit.Stream()
    legacy, on_stream = k[1, 4], k[1, 4, stream]
    assert {type(getattr(run, "__self__", None)).__name__ for run in (legacy, on_stream)} == {"Launcher"}

    def ran(v):
        with kjit.Device(0):   # the kernel's context: its legacy stream drained
            kjit.synchronize()
            np.testing.assert_array_equal(out.get(), [v] * 4)

    legacy(out, 1)
    ran(1)
    other = kjit.Context(0)
    try:
        with other:
            for v, launch in ((2, legacy), (3, on_stream), (4, legacy)):
                launch(out, v)
                assert current_context() == int(other.handle)
                ran(v)
    finally:
        other.close()
    drv = driver.bindings()
    saved = driver.call(drv.cuCtxGetCurrent)
    driver.call(drv.cuCtxSetCurrent, 0)   # none current
    try:
        for v in (5, 6):
            legacy(out, v)
            assert current_context() == 0
            ran(v)
            driver.call(drv.cuCtxSetCurrent, 0)
    finally:
        driver.call(drv.cuCtxSetCurrent, saved)
    legacy(out, 7)
    ran(7)


def test_a_launch_on_a_stream_of_its_kernels_own_context_runs_there_whatever_is_current():
    # A kernel of a kjit.Context, configured with that context's stream and given no array:
    # called while another context is current, the C launcher (the driver runs a launch on its
    # stream's context) and the Python path (another thread's launch) both run it there.
    src = r'''extern "C" __global__ void put_at(unsigned long long at, int v) { ((int*)at)[threadIdx.x] = v; }'''
    obj = kjit.compile(src)
    ctx = kjit.Context(0)
    try:
        with ctx:
            k = kjit.load(obj).get_function("put_at")
            out, stream = kjit.zeros(4, np.int32), kjit.Stream()
            run = k[1, 4, stream]
            run(out.ptr, 1)
            stream.synchronize()
            np.testing.assert_array_equal(out.get(), [1] * 4)
        errors = []

        def from_another_thread():
            try:
                run(out.ptr, 3)
                stream.synchronize()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
        run(out.ptr, 2)   # this thread: the primary context is current
        stream.synchronize()
        with ctx:
            np.testing.assert_array_equal(out.get(), [2] * 4)
        worker = threading.Thread(target=from_another_thread)
        worker.start()
        worker.join()
        assert not errors, errors
        with ctx:
            np.testing.assert_array_equal(out.get(), [3] * 4)
    finally:
        ctx.close()


def test_streams_events_and_in_out():
    src = r'''extern "C" __global__ void twice(const double* a, double* b, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) b[i] = 2 * a[i]; }'''
    k = kjit.load(kjit.compile(src)).get_function("twice")
    n = 1 << 20
    a = rng.standard_normal(n)
    b = np.zeros(n)
    s = kjit.Stream(non_blocking=True)
    start, end = kjit.Event(), kjit.Event()
    start.record(s)
    k[kjit.cdiv(n, 256), 256, s](kjit.In(a), kjit.Out(b), n)
    end.record(s)
    assert end.elapsed_time(start) > 0
    np.testing.assert_array_equal(b, 2 * a)
    c = a.copy()
    k.launch(kjit.cdiv(n, 256), 256, kjit.to_device(a), kjit.InOut(c), n, stream=s)
    np.testing.assert_array_equal(c, 2 * a)


def test_dynamic_shared_memory_above_48k():
    src = r'''extern "C" __global__ void rev(const float* x, float* y, int n) {
        extern __shared__ float buf[];
        int t = threadIdx.x;
        for (int i = t; i < n; i += blockDim.x) buf[i] = x[i];
        __syncthreads();
        for (int i = t; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
    }'''
    k = kjit.load(kjit.compile(src)).get_function("rev")
    n = 16 * 1024  # 64 KiB of floats
    xh = rng.standard_normal(n).astype(np.float32)
    y = kjit.empty(n, np.float32)
    k[1, 256, None, n * 4](kjit.to_device(xh), y, n)
    np.testing.assert_array_equal(y.get(), xh[::-1])


def test_cooperative_and_cluster_launch():
    src = r'''extern "C" __global__ void rank(unsigned* out) {
        unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
        if (threadIdx.x == 0) out[blockIdx.x] = r + 100u * blockIdx.x;
    }'''
    k = kjit.load(kjit.compile(src)).get_function("rank")
    out = kjit.zeros(8, np.uint32)
    k.launch(8, 32, out, cluster=(2, 1, 1))
    np.testing.assert_array_equal(out.get(), np.array([100 * b + b % 2 for b in range(8)], np.uint32))
    out2 = kjit.zeros(4, np.uint32)
    k.launch(4, 32, out2, cooperative=True)
    np.testing.assert_array_equal(out2.get() // 100, np.arange(4))
    with pytest.raises(ArgumentError, match="exceeds"):
        k.launch(10_000_000, 1024, out, cooperative=True)
    with pytest.raises(ArgumentError, match="multiple"):
        k.launch(7, 32, out, cluster=(2, 1, 1))


def test_illegal_address_reported_at_synchronize_with_kernel_name():
    code = textwrap.dedent('''
        import kjit
        src = 'extern "C" __global__ void bad_kernel(int* p) { p[threadIdx.x] = 1; }'
        k = kjit.load(kjit.compile(src)).get_function("bad_kernel")
        k[1, 32](kjit.ptr(8))
        try:
            kjit.synchronize()
        except kjit.DriverError as e:
            print("CAUGHT", e.cuda_name, e.runtime_name, e.hip_name, "|", e)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "CAUGHT CUDA_ERROR_ILLEGAL_ADDRESS cudaErrorIllegalAddress hipErrorIllegalAddress" in out.stdout, out.stderr
    assert "bad_kernel" in out.stdout


RESET_OUTSIDE = textwrap.dedent('''
    import sys
    import kjit, numpy as np
    from cuda.bindings import driver as cu
    k = kjit.load(kjit.compile('extern "C" __global__ void w(float* o, int n) { o[0] = n; }')).get_function("w")
    out = kjit.zeros(1, np.float32)
    L = k[1, 1]
    L(out, 3)
    assert out.get()[0] == 3
    how = sys.argv[1]
    assert cu.cuDevicePrimaryCtxReset(0)[0] == 0   # what cudaDeviceReset does to the primary context
    def attempt(what, f):
        try:
            f()
        except kjit.DriverError as e:
            print("CAUGHT", what, e.cuda_name, "|", str(e).replace("\\n", " "))
        else:
            print("RAN", what)
    attempt("launch", lambda: L(out, 4) if how == "bound" else k[1, 1](out, 4))
    attempt("synchronize", kjit.synchronize)
    attempt("zeros", lambda: kjit.zeros(1, np.float32))
''')


@pytest.mark.parametrize("how", ["bound", "table"])
def test_a_device_reset_outside_kjit_is_named_with_what_to_do(how):
    """Another library resets the device under kjit (numba's cuda.close(), CuPy's
    runtime.deviceReset(), a test harness's cudaDeviceReset): every later call says the
    context was destroyed, by what, and what to do; nothing crashes and no kernel is blamed.
    In a child process: the reset would take this process's context with it."""
    res = subprocess.run([sys.executable, "-c", RESET_OUTSIDE, how], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("CAUGHT", "RAN"))]
    assert [ln.split()[:3] for ln in lines] == [
        ["CAUGHT", what, "CUDA_ERROR_CONTEXT_IS_DESTROYED"] for what in ("launch", "synchronize", "zeros")], \
        res.stdout
    for ln in lines:
        assert "device reset" in ln and "Start a new process" in ln, ln
        assert "launched last" not in ln, ln   # the call failed, not work queued before it


def test_torch_and_cupy_interop():
    torch = pytest.importorskip("torch")
    n = 1000
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.randn(n, device="cuda", dtype=torch.float32)
    expect = 2 * x + y
    s = torch.cuda.current_stream()
    saxpy[kjit.cdiv(n, 256), 256, s](2.0, x, y, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expect)
    with pytest.raises(ArgumentError, match="not C-contiguous"):
        saxpy[1, 32](2.0, x[::2], y, 10)
    arr = kjit.to_device(np.arange(10, dtype=np.float32))
    t = torch.from_dlpack(arr)
    assert t.device.type == "cuda" and t.cpu().tolist() == list(range(10))
    t2 = torch.as_tensor(arr, device="cuda")  # via __cuda_array_interface__
    assert t2.data_ptr() == arr.ptr
    cp = import_cupy()
    cx, cy = cp.asarray(rng.standard_normal(n).astype(np.float32)), cp.zeros(n, cp.float32)
    saxpy[kjit.cdiv(n, 256), 256](1.0, cx, cy, n)
    cp.cuda.Device().synchronize()
    np.testing.assert_allclose(cp.asnumpy(cy), cp.asnumpy(cx))
    dl = torch.zeros(n, device="cuda")
    class DlpackOnly:  # exercises the __dlpack__ import path alone
        def __init__(self, t): self.t = t
        def __dlpack__(self, **kw): return self.t.__dlpack__(**kw)
        def __dlpack_device__(self): return self.t.__dlpack_device__()
    saxpy[kjit.cdiv(n, 256), 256](1.0, cx, DlpackOnly(dl), n)
    torch.cuda.synchronize()
    np.testing.assert_allclose(dl.cpu().numpy(), cp.asnumpy(cx))


def test_failed_launch_leaves_no_pending_copies_and_odd_values_take_the_careful_path():
    src = r'''extern "C" __global__ void fill(int* out, int v, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = v; }'''
    k = kjit.load(kjit.compile(src)).get_function("fill")
    first = np.full(64, -1, np.int32)
    with pytest.raises(DriverError):
        k[1, 4096](kjit.Out(first), 5, 64)            # too many threads: nothing runs
    second = np.zeros(64, np.int32)
    k[[2, 1], 32](kjit.Out(second), np.bool_(True), np.int64(64))   # list grid, numpy scalars
    np.testing.assert_array_equal(second, np.ones(64, np.int32))
    np.testing.assert_array_equal(first, np.full(64, -1, np.int32))  # untouched by the later launch


def test_zeros_and_in_copies_are_complete_before_a_non_blocking_stream_reads_them():
    src = r'''extern "C" __global__ void add(const float* a, const float* b, float* c, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) c[i] = a[i] + b[i]; }'''
    k = kjit.load(kjit.compile(src)).get_function("add")
    s = kjit.Stream(non_blocking=True)
    n = 1 << 22
    for _ in range(3):
        ah = rng.standard_normal(n).astype(np.float32)
        out = np.empty(n, np.float32)
        k[kjit.cdiv(n, 256), 256, s](kjit.In(ah), kjit.zeros(n, np.float32), kjit.Out(out), n)
        np.testing.assert_array_equal(out, ah)


def test_compile_for_the_device_makes_its_context_in_the_background():
    # compile(arch=None) asks only the compute capability; the primary context it will
    # need for loading is created meanwhile on a helper thread. A fresh process that only
    # compiles must still exit cleanly, and one that loads must find the context ready.
    code = textwrap.dedent('''
        import sys, threading, kjit
        from kjit import driver
        src = 'extern "C" __global__ void f(int* p) { p[0] = 42; }'
        obj = kjit.compile(src)
        assert 0 in driver._warming and 0 not in driver._primary   # started, not waited for
        if sys.argv[1] == "load":
            out = kjit.zeros(1, "int32")
            kjit.load(obj).get_function("f")[1, 1](out)
            assert out.get()[0] == 42
        print("OK")
    ''')
    for mode in ("compile-only", "load"):
        res = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "OK" in res.stdout, res.stderr
