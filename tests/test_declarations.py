"""Kernel declarations read as the compiler reads them, on the CPU: each spelling below must
give the same parameter names and C types from the source, from the digest compile() keeps of
it (`declarations.extract`), and through `signature.resolve_slots`, which types a loaded kernel.

Spellings come from what users bring: CuPy's own tests write kernels with line splices inside
`extern "C" { ... }` blocks and pick their types with macros (cupy/cupy, commit
00f8572fe65269fa6c3e535c9fc71b1f42404de1, tests/cupy_tests/core_tests/test_raw.py:
`_test_source2`, `_test_source3`, `_test_cuComplex`); the CUDA programming guide's
`__launch_bounds__`, `__cluster_dims__`, `__grid_constant__` and `__align__`. The kernels here
are written for these tests.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from kjit.compiler.declarations import extract, preprocess
from kjit.runtime.cdecl import parse_signatures, parse_structs
from kjit.runtime.signature import resolve_slots


def describe(ctype) -> str:
    """`float* <f4`, `const float* <f4`, `uint 4`, `complex 16 <c16`, `struct 16/16`, `?`."""
    if ctype is None:
        return "?"
    if ctype.kind == "pointer":
        return f"{'const ' if ctype.const else ''}ptr {ctype.typestr}"
    if ctype.kind == "struct":
        return f"struct {ctype.size}/{ctype.align}"
    return f"{ctype.kind} {ctype.size}" + (f" {ctype.typestr}" if ctype.kind == "complex" else "")


def signatures(text: str) -> dict[str, list[str]]:
    return {k: [f"{p.name}: {describe(p.ctype)}" for p in sig.params]
            for k, sig in parse_signatures(text).items()}


SPLICE_BLOCK = '''extern "C"{

__global__ void add(const float* x1, const float* x2, float* y, \\
                    unsigned int N)
{
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < N) y[tid] = x1[tid] + x2[tid];
}

__global__ void mul(const float* x1, const float* x2, float* y, \\
                    unsigned int N)
{
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < N) y[tid] = x1[tid] * x2[tid];
}

}
'''
ADD4 = ["x1: const ptr <f4", "x2: const ptr <f4", "y: ptr <f4", "N: uint 4"]

CASES = {
    # CuPy's _test_source2: an extern "C" block, the last parameter after a line splice
    "cupy extern C block with splices": (SPLICE_BLOCK, {"add": ADD4, "mul": ADD4}),
    "splice inside a type": ('extern "C" __global__ void k(float* y, unsigned \\\n int N) {}',
                             {"k": ["y: ptr <f4", "N: uint 4"]}),
    "splice inside a word": ('extern "C" __global__ void k(float* y, uns\\\nigned int N) {}',
                             {"k": ["y: ptr <f4", "N: uint 4"]}),
    "splice with CRLF": ('extern "C" __global__ void k(float* y, \\\r\n unsigned int N) {}',
                         {"k": ["y: ptr <f4", "N: uint 4"]}),
    "splice after a // comment continues the comment": (
        'extern "C" __global__ void k(float* y, // a note \\\n int* hidden,\n int N) {}',
        {"k": ["y: ptr <f4", "N: int 4"]}),
    "comments inside the parameter list": (
        'extern "C" __global__ void k(float* x /* in, (a) */, // out\n double* y, int /*n*/ n) {}',
        {"k": ["x: ptr <f4", "y: ptr <f8", "n: int 4"]}),
    "comment markers inside a string are text": (
        '__device__ const char msg[] = "a /* b // c";\n'
        'extern "C" __global__ void k(float* x, int n) {}',
        {"k": ["x: ptr <f4", "n: int 4"]}),
    "object-like macros naming types": (
        "#define T float\n#define IDX unsigned int\n#define SIZE IDX\n"
        'extern "C" __global__ void k(const T* x, T a, SIZE n) {}',
        {"k": ["x: const ptr <f4", "a: float 4", "n: uint 4"]}),
    "a macro spelling the kernel's prefix": (
        '#define KERNEL extern "C" __global__\nKERNEL void k(double* x) {}',
        {"k": ["x: ptr <f8"]}),
    "macro redefined after #undef": (
        "#define T float\n"
        'extern "C" __global__ void a(T* x) {}\n'
        "#undef T\n#define T int\n"
        'extern "C" __global__ void b(T* x) {}',
        {"a": ["x: ptr <f4"], "b": ["x: ptr <i4"]}),
    "#if 0 hides a kernel, #else shows the other": (
        '#if 0\nextern "C" __global__ void k(float* x) {}\n#else\n'
        'extern "C" __global__ void k(double* x) {}\n#endif',
        {"k": ["x: ptr <f8"]}),
    # a macro set in a branch kjit cannot decide (a -D it was not told): its type stays unknown,
    # never guessed; the pointer is still a pointer
    "macro from an undecidable branch stays unknown": (
        "#ifdef USE_DOUBLE\n#define real double\n#else\n#define real float\n#endif\n"
        'extern "C" __global__ void k(real* x, real a, int n) {}',
        {"k": ["x: ptr None", "a: ?", "n: int 4"]}),
    "restrict and grid_constant": (
        "struct P { float a; int b; };\n"
        'extern "C" __global__ void k(const float* __restrict__ x, float* __restrict y, '
        "const __grid_constant__ P p, volatile int* flag) {}",
        {"k": ["x: const ptr <f4", "y: ptr <f4", "p: struct 8/4", "flag: ptr <i4"]}),
    "launch bounds, cluster dims, attributes in any place": (
        '#define MAXT(a) (a)\nextern "C" __global__ void __launch_bounds__(MAXT(256), 2) a(int n) {}\n'
        'extern "C" __global__ __launch_bounds__(128) void b(int n) {}\n'
        'extern "C" void __global__ c(int n) {}\n'
        'extern "C" __global__ void __cluster_dims__(2, 1, 1) d([[maybe_unused]] int n) {}',
        {"a": ["n: int 4"], "b": ["n: int 4"], "c": ["n: int 4"], "d": ["n: int 4"]}),
    "array parameters are pointers": (
        'extern "C" __global__ void k(float x[], const double y[16], int n) {}',
        {"k": ["x: ptr <f4", "y: const ptr <f8", "n: int 4"]}),
    "unnamed parameters, void, a prototype before the definition": (
        'extern "C" __global__ void k(float*, unsigned, long long);\n'
        'extern "C" __global__ void z(void) {}',
        {"k": ["arg0: ptr <f4", "arg1: uint 4", "arg2: int 8"], "z": []}),
    "integer words in any order, std:: names": (
        'extern "C" __global__ void k(long unsigned int a, int unsigned b, short unsigned c, '
        "signed d, unsigned long long int e, std::size_t f, ::int64_t g, std::uint8_t h) {}",
        {"k": ["a: uint 8", "b: uint 4", "c: uint 2", "d: int 4", "e: uint 8", "f: uint 8",
               "g: int 8", "h: uint 1"]}),
    "a const pointer and a pointer to pointers": (
        'extern "C" __global__ void k(float* const x, const float* const* xs) {}',
        {"k": ["x: ptr <f4", "xs: const ptr None"]}),
    "default arguments": ('extern "C" __global__ void k(float* x, int n = (3, 4)) {}',
                          {"k": ["x: ptr <f4", "n: int 4"]}),
    # the template is typed from its mangled name at load; the plain kernel beside it from here
    "default template arguments": (
        "template <typename T = float, int N = (4 > 2)> struct Box { T v[N]; };\n"
        "template <typename T = float> __global__ void t(T* x, int n) {}\n"
        'extern "C" __global__ void k(double* x, int n) {}',
        {"k": ["x: ptr <f8", "n: int 4"]}),
    # CuPy's _test_cuComplex, and CuPy's complex<T> (thrust's), libcu++'s and PyTorch's
    "complex types": (
        "typedef thrust::complex<float> cf;\n"
        'extern "C" __global__ void k(cuComplex a, cuFloatComplex b, cuDoubleComplex c, '
        "complex<float> d, thrust::complex<double> e, cuda::std::complex<float> f, "
        "::cuda::std::complex< double > g, std::complex<double> h, cf i, c10::complex<float> j) {}",
        {"k": ["a: complex 8 <c8", "b: complex 8 <c8", "c: complex 16 <c16",
               "d: complex 8 <c8", "e: complex 16 <c16", "f: complex 8 <c8",
               "g: complex 16 <c16", "h: complex 16 <c16", "i: complex 8 <c8",
               "j: complex 8 <c8"]}),
    "pointers to complex": (
        'extern "C" __global__ void k(cuDoubleComplex* a, const cuComplex* b, '
        "thrust::complex<float>* c, cuda::std::complex<double>* d) {}",
        {"k": ["a: ptr <c16", "b: const ptr <c8", "c: ptr <c8", "d: ptr <c16"]}),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_declaration_spellings(case):
    src, want = CASES[case]
    assert signatures(src) == want
    digest = extract(src)
    assert signatures(digest) == want, digest
    assert "\\" not in digest and "#" not in digest
    obj = SimpleNamespace(metadata={"declarations": digest})
    for name, params in want.items():
        if "?" in " ".join(params):
            continue   # a loaded kernel with an unknown type takes the driver's sizes
        slots = resolve_slots(obj, name, name, None)
        assert [f"{s.name}: {describe(s.ctype)}" for s in slots] == params


def test_a_digest_holding_a_splice_as_a_backslash_is_read():
    """Objects cached by a kjit that kept a splice in its digest (`float* y, \\ unsigned int N`)
    are typed the same."""
    assert signatures('__global__ void k(float* y, \\ unsigned int N) {}') == {
        "k": ["y: ptr <f4", "N: uint 4"]}


def test_the_compile_s_own_defines_decide_macros():
    """CuPy's _test_source3, compiled with -DPRECISION=2 or =1: the type the kernel takes is
    the one the compiler saw; without the defines it is unknown rather than guessed."""
    src = ("#ifndef PRECISION\n    #define PRECISION 2\n#endif\n\n"
           "#if PRECISION == 2\n    #define TYPE double\n#elif PRECISION == 1\n"
           "    #define TYPE float\n#else\n    #error precision not supported\n#endif\n\n"
           'extern "C"{\n__global__ void test_sum(const TYPE* x1, TYPE* y, \\\n'
           "                         unsigned int N) {}\n}\n")
    by = {None: "None", (("PRECISION", "2"),): "<f8", (("PRECISION", "1"),): "<f4",
          (("PRECISION", None),): "<f4"}   # -DPRECISION alone is 1
    for defines, typestr in by.items():
        sig = parse_signatures(extract(src, defines or ()))["test_sum"]
        assert [str(p.ctype.typestr) for p in sig.params] == [typestr, typestr, "<u4"], defines


def test_the_macros_a_compile_defines_on_its_command_line():
    """CuPy passes `options=('-DPRECISION=2',)`: in kjit, `defines` or raw `extra` flags."""
    from kjit.compiler.declarations import macros_of
    from kjit.compiler.options import CompileOptions
    opts = CompileOptions(defines={"A": "1", "B": None},
                          extra=["-DPRECISION=2", "-D", "TYPE=float", "--define-macro=FLAG"])
    assert macros_of(opts) == [("A", "1"), ("B", None), ("PRECISION", "2"), ("TYPE", "float"),
                               ("FLAG", None)]
    src = 'extern "C" __global__ void k(TYPE* x, int n) {}'
    assert signatures(extract(src, macros_of(opts))) == {"k": ["x: ptr <f4", "n: int 4"]}


@pytest.mark.parametrize("expr, value", [
    ("1", True), ("0", False), ("2 > 1 && 3", True), ("!0", True), ("0x10 == 16", True),
    ("defined(A)", True), ("defined B", False), ("A == 3", True), ("(A + 1) / 2 == 2", True),
    ("UNSEEN", None), ("defined(UNSEEN)", None), ("__has_include(<x.h>)", None),
    ("010 == 8", True), ("1 ? 2 : 3", None), ("9 ** 9 ** 9", None), ("1 << 100000000", None),
    ("1 << 4 == 16", True),
])
def test_if_conditions(expr, value):
    src = f"#define A 3\n#undef B\n#if {expr}\nint yes;\n#else\nint no;\n#endif\n"
    text = preprocess(src)
    got = ("yes" in text, "no" in text)
    assert got == {True: (True, False), False: (False, True), None: (True, True)}[value]


STRUCTS = {
    "plain": ("struct S { float a; double b; };", 16, 8, [("a", 0), ("b", 8)]),
    "__align__ before the name": ("struct __align__(16) S { float a; };", 16, 16, [("a", 0)]),
    "alignas": ("struct alignas(8) S { int a; };", 8, 8, [("a", 0)]),
    "typedef of an anonymous struct": ("typedef struct __align__(8) { float x; } S;", 8, 8,
                                       [("x", 0)]),
    "attribute after the body": ("typedef struct { float x; } __attribute__((aligned(16))) S;",
                                 16, 16, [("x", 0)]),
    "aligned member": ("struct S { char c; alignas(16) float x; };", 32, 16, [("c", 0), ("x", 16)]),
    "several declarators": ("struct S { float x, y; int *p, n; };", 24, 8,
                            [("x", 0), ("y", 4), ("p", 8), ("n", 16)]),
    "member functions, constructors, labels, statics": (
        "struct S { public: float x, y; static const int k = 3;\n"
        "  __host__ __device__ S() : x{0}, y(1) {}\n"
        "  __device__ float norm() const { return x * x + y * y; }\n"
        "  private: int n{2}; };", 12, 4, [("x", 0), ("y", 4), ("n", 8)]),
    "array fields": ("struct S { int c[2]; double3 v; float m[2][3]; };", 56, 8,
                     [("c", 0), ("v", 8), ("m", 32)]),
    "complex fields": ("struct S { char t; cuDoubleComplex z; cuComplex w; };", 48, 16,
                       [("t", 0), ("z", 16), ("w", 32)]),
    "a splice and a macro inside": ("#define N 3\nstruct S { float \\\n v[N]; };", 12, 4,
                                    [("v", 0)]),
}


@pytest.mark.parametrize("case", list(STRUCTS), ids=list(STRUCTS))
def test_struct_spellings(case):
    src, size, align, fields = STRUCTS[case]
    for text in (src, extract(src)):
        s = parse_structs(text)["S"]
        assert (s.size, s.align) == (size, align), text
        assert [(n, off) for n, off, _ in s.fields] == fields


@pytest.mark.parametrize("src", [
    "struct S { int a : 3; int b; };",                 # bit-fields
    "struct S { virtual void f(); int a; };",          # a vtable pointer
    "struct S { void (*f)(int); };",                   # a function pointer
    "struct S : Base { int a; };",                     # a base class
    "struct S { alignas(T) int a; };",                 # an alignment kjit cannot compute
    "template <int N> struct S { float v[N]; };",      # a size that depends on N
    "struct S { char c; alignas(sizeof(float) * 4) float x; };",
    "struct alignas(2 * sizeof(float)) S { float re, im; };",
], ids=["bitfield", "virtual", "function pointer", "base", "alignas(T)", "template",
        "alignas(expression) member", "alignas(expression) struct"])
def test_structs_beyond_a_plain_reading_stay_unknown(src):
    """Their layout comes from the driver's sizes: kjit never guesses one."""
    assert "S" not in parse_structs(src)
    sig = parse_signatures(src + '\nextern "C" __global__ void k(S s) {}')["k"]
    assert sig.params[0].ctype is None


def test_enum_class_is_no_struct():
    assert parse_structs("enum class S { A, B };") == {}


def test_a_cplusplus_kernel_keeps_its_source_types_and_names():
    """A kernel without extern "C" is found by its mangled name, which spells cuComplex as
    float2: the source's declaration gives it back its complex type and parameter names; an
    overload of another type keeps what its mangled name says."""
    digest = extract("__global__ void k(cuComplex* z, cuDoubleComplex w, int n) {}\n"
                     "__global__ void h(float* x) {}\n__global__ void h(double* x) {}")
    obj = SimpleNamespace(metadata={"declarations": digest})
    slots = resolve_slots(obj, "k", "_Z1kP6float27double2i", None)
    assert [f"{s.name}: {describe(s.ctype)}" for s in slots] == [
        "z: ptr <c8", "w: complex 16 <c16", "n: int 4"]
    slots = resolve_slots(obj, "h", "_Z1hPf", None)
    assert [describe(s.ctype) for s in slots] == ["ptr <f4"]
    slots = resolve_slots(obj, "t", "_Z1tIfEvPT_i", None)   # template<typename T = float>
    assert [describe(s.ctype) for s in slots] == ["ptr <f4", "int 4"]
