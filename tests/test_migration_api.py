"""What users of PyCUDA, cuda.core and CuPy hand kjit first, without a GPU.

- PTX text as a str (cuda.core's `ObjectCode.from_ptx` and CuPy's RawModule take it) is loaded
  and linked as PTX, not read as a file name; CUDA source is refused with how to compile it.
- A cuda.core ObjectCode (bytes or a file path in `.code`, `.code_type`, `.symbol_mapping`)
  is taken as it is. Its cases follow cuda.core's own tests of ObjectCode.from_ptx/from_cubin/
  from_ltoir, in memory and from a file (NVIDIA/cuda-python, commit 01db773955806205e65e0553c8d22192419cc440,
  cuda_core/tests/test_module.py); cuda.core needs a driver even to compile, so here a plain
  class with the same attributes stands in, and tests/test_migration_api_gpu.py uses the real one.
- A kernel without extern "C" is found by its plain C++ name when that is unique among the
  module's kernels (PyCUDA's SourceModule wraps the source in extern "C", so its users write
  plain names: inducer/pycuda, commit a14bf90c5190ff1cbaa35d3f314720ffbc7396a6, test/test_driver.py;
  cuda.core's test_num_arguments asks for `__global__ void foo(int a)` as "foo"); an ambiguous
  name lists the kernels demangled with the name expressions that pick each.
- A Module says it belongs to one process when pickled.
"""
from __future__ import annotations

import ast
import copy
import pickle

import pytest

import kjit
from kjit.errors import ArgumentError, InvalidOptionError, KernelNotFoundError
from kjit.linker import link
from kjit.objectcode import ObjectCode, from_foreign_code, from_text_or_path
from kjit.runtime.mangled import KernelNameError, demangle, find_kernel, function_name
from kjit.runtime.module import Module, _as_object

ARCH = "sm_90"

SAXPY = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
'''
# C++ linkage, as PyCUDA and cuda.core users write kernels
CPP = r'''
__global__ void scale(float* y, float by, int n) { if (threadIdx.x < n) y[threadIdx.x] *= by; }
__global__ void add(int* y, int v) { y[threadIdx.x] += v; }
__global__ void add(float* y, float v) { y[threadIdx.x] += v; }
namespace ops { __global__ void negate(double* y) { y[threadIdx.x] = -y[threadIdx.x]; } }
template <typename T, int N> __global__ void fill(T* out, T value) {
    if (threadIdx.x < N) out[threadIdx.x] = value;
}
template <typename T> __global__ void only(T* out) { out[0] = T(1); }
'''
CPP_EXPRS = ["fill<float, 4>", "fill<int, 8>", "only<double>"]


@pytest.fixture(scope="module")
def ptx_text() -> str:
    return kjit.compile(SAXPY, arch=ARCH, target="ptx").code.decode()


@pytest.fixture(scope="module")
def cpp() -> ObjectCode:
    return kjit.compile(CPP, arch=ARCH, name_expressions=CPP_EXPRS)


# --- PTX text --------------------------------------------------------------------------

def test_ptx_text_as_a_str_is_ptx_not_a_file_name(ptx_text):
    assert ptx_text.startswith("//")   # NVRTC's PTX opens with comments
    for text in (ptx_text, ptx_text[ptx_text.index(".version"):]):   # or with .version
        obj = _as_object(text)
        assert obj.kind == "ptx" and obj.entry_points == ("saxpy",)
        assert obj.code == text.encode() and obj.arch == "compute_90"


def test_ptx_bytes_and_bytearrays_load_as_ptx(ptx_text):
    for data in (ptx_text.encode(), bytearray(ptx_text.encode())):
        assert _as_object(data).kind == "ptx"


def test_a_str_naming_a_file_is_still_a_path(tmp_path, ptx_text):
    path = tmp_path / "saxpy.ptx"
    path.write_text(ptx_text)
    obj = _as_object(str(path))
    assert obj.kind == "ptx" and obj.name == "saxpy.ptx"
    assert _as_object(path).code == obj.code


def test_cuda_source_text_is_refused_with_how_to_compile_it():
    with pytest.raises(InvalidOptionError, match=r"CUDA C\+\+ source.*kjit.load\(kjit.compile"):
        _as_object(SAXPY)
    with pytest.raises(InvalidOptionError, match="neither PTX nor the path"):
        _as_object("just some\ntext")
    with pytest.raises(InvalidOptionError, match="no such file"):
        _as_object("missing.cubin")


def test_other_types_are_named_with_what_load_takes():
    with pytest.raises(ArgumentError, match=r"cuda.core ObjectCode, bytes, PTX text .*got builtins.int"):
        _as_object(42)


def test_ptx_text_links(ptx_text):
    lib = kjit.compile('extern "C" __device__ float twice(float x) { return 2 * x; }',
                       arch=ARCH, target="ptx", options=kjit.CompileOptions(relocatable=True))
    main = kjit.compile('extern "C" __device__ float twice(float x);\n'
                        'extern "C" __global__ void k(float* y) { y[0] = twice(y[0]); }',
                        arch=ARCH, target="ptx", options=kjit.CompileOptions(relocatable=True))
    res = link([lib.code.decode(), main.code.decode()], arch=ARCH, backend="nvjitlink")
    assert res.entry_points == ("k",)
    assert res.metadata["inputs"] == ["inline.ptx#0", "inline.ptx#1"]


# --- cuda.core ObjectCode ----------------------------------------------------------------

class ForeignObjectCode:
    """The attributes cuda.core's ObjectCode has: `code` is bytes, or a str naming a file;
    symbol_mapping's lowered names are bytes, as nvrtcGetLoweredName returns them."""

    def __init__(self, code, code_type, name="", symbol_mapping=None):
        self.code, self.code_type, self.name = code, code_type, name
        self.symbol_mapping = dict(symbol_mapping or {})


def _mapping(obj: ObjectCode) -> dict:
    return {k: v.encode() for k, v in obj.symbols.items()}


@pytest.mark.parametrize("target", ["ptx", "cubin", "ltoir"])
def test_a_cuda_core_object_code_in_memory(target, cpp):
    ours = kjit.compile(CPP, arch=ARCH, target=target, name_expressions=CPP_EXPRS)
    theirs = ForeignObjectCode(ours.code, target, "cpp", _mapping(ours))
    obj = _as_object(theirs)
    assert type(obj) is ObjectCode and obj.kind == target and obj.code == ours.code
    assert dict(obj.symbols) == dict(ours.symbols) and obj.name == "cpp"
    assert obj.lowered_name("fill<int, 8>") == ours.lowered_name("fill<int, 8>")


def test_a_cuda_core_object_code_from_a_file(tmp_path, cpp):
    path = tmp_path / "cpp.cubin"
    path.write_bytes(cpp.code)
    obj = _as_object(ForeignObjectCode(str(path), "cubin", symbol_mapping=_mapping(cpp)))
    assert obj.kind == "cubin" and obj.code == cpp.code and dict(obj.symbols) == dict(cpp.symbols)


def test_cuda_core_object_codes_link():
    rdc = kjit.CompileOptions(relocatable=True)
    lib = kjit.compile('extern "C" __device__ int one() { return 1; }', arch=ARCH,
                       target="ltoir", options=rdc)
    main = kjit.compile('extern "C" __device__ int one();\n'
                        'extern "C" __global__ void k(int* y) { y[0] = one(); }',
                        arch=ARCH, target="ltoir", options=rdc)
    res = link([ForeignObjectCode(lib.code, "ltoir"), ForeignObjectCode(main.code, "ltoir")],
               arch=ARCH)
    assert res.entry_points == ("k",)


def test_a_foreign_code_type_kjit_does_not_take_is_named():
    with pytest.raises(InvalidOptionError, match="code_type 'nvvm'"):
        from_foreign_code(ForeignObjectCode(b"...", "nvvm"))
    with pytest.raises(InvalidOptionError, match="link input #0: .*code_type 'nvvm'"):
        link([ForeignObjectCode(b"...", "nvvm")], arch=ARCH)


def test_an_unlowered_expression_is_left_out():
    """cuda.core keeps None for a name expression NVRTC did not lower."""
    cubin = kjit.compile(SAXPY, arch=ARCH)
    obj = from_foreign_code(ForeignObjectCode(cubin.code, "cubin",
                                              symbol_mapping={"x": None, b"y": b"saxpy"}))
    assert dict(obj.symbols) == {"y": "saxpy"}


def test_from_text_or_path_names_its_caller():
    with pytest.raises(InvalidOptionError, match=r"kjit.link got .*kjit.link\(\[kjit.compile"):
        from_text_or_path(SAXPY, "kjit.link")


# --- plain C++ names ----------------------------------------------------------------------

def test_nvrtc_names_demangle(cpp):
    shown = {s: demangle(s) for s in cpp.entry_points}
    assert sorted(shown.values()) == sorted([
        "scale(float*, float, int)", "add(int*, int)", "add(float*, float)",
        "ops::negate(double*)", "fill<float, 4>(float*, float)", "fill<int, 8>(int*, int)",
        "only<double>(double*)"])
    assert function_name(cpp.lowered_name("only<double>")) == ("only<double>", True)
    assert demangle("saxpy") is None   # extern "C": nothing to decode


@pytest.mark.parametrize("name, expr", [
    ("scale", None), ("negate", None), ("ops::negate", None),
    ("only", "only<double>"), ("fill<int, 8>", "fill<int, 8>"),
    ("scale(float*, float, int)", None)])
def test_a_unique_plain_name_finds_its_kernel(cpp, name, expr):
    symbol = find_kernel(name, cpp.entry_points, cpp.symbols)
    assert symbol in cpp.entry_points and symbol.startswith("_Z")
    if expr:
        assert symbol == cpp.lowered_name(expr)
    else:
        assert demangle(symbol).split("(")[0].endswith(name.split("(")[0])


@pytest.mark.parametrize("name, count", [("add", 2), ("fill", 2)])
def test_an_ambiguous_name_lists_the_kernels_and_the_name_expressions_that_pick_each(
        cpp, name, count):
    with pytest.raises(KernelNotFoundError) as info:
        find_kernel(name, cpp.entry_points, cpp.symbols)
    err = info.value
    assert isinstance(err, KernelNameError) and len(err.candidates) == count
    text = str(err)
    assert f"kernel name {name!r} is ambiguous" in text and "name_expressions=" in text
    for symbol in err.candidates:
        assert demangle(symbol) in text and symbol in text
    # the expressions the message offers compile and lower to exactly those kernels
    offered = ast.literal_eval(text.split("name_expressions=")[1].split("]")[0] + "]")
    again = kjit.compile(CPP, arch=ARCH, name_expressions=offered)
    assert sorted(again.symbols.values()) == sorted(err.candidates)


def test_an_unknown_name_lists_the_kernels_demangled(cpp):
    with pytest.raises(KernelNotFoundError, match=r"no kernel named 'nope'.*\(scale\(float\*, float, int\)\)"):
        find_kernel("nope", cpp.entry_points, cpp.symbols)


# --- a Module belongs to one process ----------------------------------------------------

def test_a_module_refuses_pickle_and_says_what_to_pickle():
    module = Module(kjit.compile(SAXPY, arch=ARCH))   # not loaded: no GPU needed
    for attempt in (pickle.dumps, copy.deepcopy):
        with pytest.raises(ArgumentError, match=r"cannot be pickled.*module.object.*kjit.load"):
            attempt(module)
    # the advice is what works: the code pickles
    assert pickle.loads(pickle.dumps(module.object)) == module.object
