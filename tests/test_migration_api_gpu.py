"""On a GPU: the declarations that travel with code let launches take Python numbers, and what
migrating users hand kjit.load runs.

Each test launches and checks results: a linked LTO-IR kernel, saved and read back code,
a kjit build fatbin and code unpickled in another process all take a Python int for an `int`
parameter; PTX text, a cuda.core ObjectCode (as cuda.core's tests make them: NVIDIA/cuda-python,
commit 01db773955806205e65e0553c8d22192419cc440, cuda_core/tests/test_module.py) and C++
kernels asked for by plain names (PyCUDA's style: inducer/pycuda, commit
a14bf90c5190ff1cbaa35d3f314720ffbc7396a6, test/test_driver.py) load and run.
"""
from __future__ import annotations

import ast
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kjit
from kjit.build import run_build
from kjit.errors import ArgumentError, KernelNotFoundError

pytestmark = pytest.mark.gpu
RDC = kjit.CompileOptions(relocatable=True)

LIB = r'''extern "C" __device__ int scale(int x, int by) { return x * by; }'''
MAIN = r'''
extern "C" __device__ int scale(int x, int by);
extern "C" __global__ void scaled(int* out, int factor) { out[threadIdx.x] = scale(threadIdx.x, factor); }
'''
STANDALONE = MAIN.replace('extern "C" __device__ int scale(int x, int by);',
                          "__device__ int scale(int x, int by) { return x * by; }")
SAXPY_T = r'''
template <typename T>
__global__ void saxpy(const T a, const T* x, T* y, size_t n) {
    size_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''
CPP = r'''
__global__ void scale_by(float* y, float by, int n) { if (threadIdx.x < n) y[threadIdx.x] *= by; }
__global__ void add(int* y, int v) { y[threadIdx.x] += v; }
__global__ void add(float* y, float v) { y[threadIdx.x] += v; }
'''


def dev_arch() -> str:
    from kjit.arch import device_arch
    return device_arch().sm


def run_scaled(code, factor: int = 7) -> np.ndarray:
    k = kjit.load(code).get_function("scaled")
    out = kjit.zeros(32, np.int32)
    k[1, 32](out, factor)   # a Python int for the int parameter
    return out.get()


def expected(factor: int = 7) -> np.ndarray:
    return np.arange(32, dtype=np.int32) * factor


def linked():
    a = kjit.compile(LIB, arch=dev_arch(), target="ltoir", options=RDC)
    b = kjit.compile(MAIN, arch=dev_arch(), target="ltoir", options=RDC)
    return kjit.link([a, b])


def test_a_linked_lto_ir_kernel_takes_a_python_int():
    res = linked()
    assert res.kind == "cubin"
    np.testing.assert_array_equal(run_scaled(res), expected())


def test_linked_code_saved_and_read_back_takes_a_python_int(tmp_path):
    path = linked().save(tmp_path / "scaled.cubin")
    np.testing.assert_array_equal(run_scaled(str(path)), expected())
    np.testing.assert_array_equal(run_scaled(kjit.ObjectCode.from_file(path), 3), expected(3))


def test_a_kjit_build_fatbin_takes_a_python_int(tmp_path):
    src = tmp_path / "scaled.cu"
    src.write_text(STANDALONE)
    res = run_build([src], output=tmp_path / "scaled.fatbin", archs=[dev_arch()], jobs=1)
    np.testing.assert_array_equal(run_scaled(res.output, 5), expected(5))


def test_code_pickled_to_another_process_takes_a_python_int(tmp_path):
    blob = tmp_path / "code.pickle"
    blob.write_bytes(pickle.dumps(linked()))
    child = textwrap.dedent(f'''
        import pickle, numpy as np, kjit
        code = pickle.loads(open({str(blob)!r}, "rb").read())
        k = kjit.load(code).get_function("scaled")
        out = kjit.zeros(32, np.int32)
        k[1, 32](out, 9)
        print(type(code).__name__, out.get().tolist())
    ''')
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr
    name, values = done.stdout.split(" ", 1)
    assert name == "LinkResult" and ast.literal_eval(values) == expected(9).tolist()


def test_ptx_text_loads_and_runs():
    ptx = kjit.compile(STANDALONE, arch=dev_arch(), target="ptx").code.decode()
    np.testing.assert_array_equal(run_scaled(ptx, 4), expected(4))


def test_a_plain_cpp_name_finds_a_unique_kernel_and_it_takes_python_numbers():
    module = kjit.load(kjit.compile(CPP, arch=dev_arch()))
    k = module.get_function("scale_by")
    assert k is module.get_function("scale_by")
    host = np.arange(16, dtype=np.float32)
    y = kjit.to_device(host)
    k[1, 16](y, 2.5, 16)
    np.testing.assert_allclose(y.get(), host * 2.5)


def test_an_ambiguous_name_says_how_to_pick_and_the_way_it_names_works():
    with pytest.raises(KernelNotFoundError, match=r"'add' is ambiguous(.|\n)*add\(int\*, int\)"):
        kjit.load(kjit.compile(CPP, arch=dev_arch())).get_function("add")
    expr = "static_cast<void(*)(int*, int)>(add)"
    module = kjit.load(kjit.compile(CPP, arch=dev_arch(), name_expressions=[expr]))
    y = kjit.zeros(8, np.int32)
    module.get_function(expr)[1, 8](y, 3)
    np.testing.assert_array_equal(y.get(), np.full(8, 3, np.int32))


def _cuda_core():
    try:
        import cuda.core as core
        core.Program
    except (ImportError, AttributeError):
        core = pytest.importorskip("cuda.core.experimental")
    return core


@pytest.mark.parametrize("target", ["cubin", "ptx"])
def test_a_cuda_core_object_code_loads_and_runs(target, tmp_path):
    core = _cuda_core()
    core.Device().set_current()
    prog = core.Program(SAXPY_T, code_type="c++",
                        options=core.ProgramOptions(arch=dev_arch()))
    theirs = prog.compile(target, name_expressions=("saxpy<float>", "saxpy<double>"))
    codes = [theirs]
    if target == "cubin":   # cuda.core keeps a file's path in .code
        path = tmp_path / "saxpy.cubin"
        path.write_bytes(bytes(theirs.code))
        codes.append(core.ObjectCode.from_cubin(str(path), symbol_mapping=theirs.symbol_mapping))
    for code in codes:
        k = kjit.load(code).get_function("saxpy<float>")
        x = np.arange(64, dtype=np.float32)
        y = kjit.to_device(np.ones(64, np.float32))
        k[1, 64](2.0, kjit.to_device(x), y, 64)
        np.testing.assert_allclose(y.get(), 2.0 * x + 1)


def test_a_loaded_module_refuses_pickle():
    module = kjit.load(kjit.compile(STANDALONE, arch=dev_arch()))
    module.get_function("scaled")
    with pytest.raises(ArgumentError, match="module.object"):
        pickle.dumps(module)
    np.testing.assert_array_equal(run_scaled(pickle.loads(pickle.dumps(module.object))), expected())
