"""Kernels written for nvcc compile unchanged: kjit's device-side standard headers (issue 19).

CPU only (NVRTC); tests/test_std_headers_gpu.py runs the same kernels against numpy.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import kjit
from kjit.compiler.cached import compile_key
from kjit.cli.main import cli
from kjit.compiler import stdheaders
from kjit.compiler import include_path
from kjit.compiler.options import CompileOptions
from kjit.errors import CompileError, DriverError

KERNELS = Path(__file__).parent / "data" / "nvcc_kernels"

# The template instantiations each file's users launch (tests/test_std_headers_gpu.py runs them).
NAME_EXPRESSIONS = {
    "sgemm.cu": ["sgemm2DBlocktiling<128, 128, 8, 8, 8>", "sgemm2DBlocktiling<64, 64, 8, 4, 4, true>",
                 "sgemm_naive"],
    "softmax.cu": ["softmax_forward<256>", "softmax_forward<128>"],
    "layernorm.cu": ["layernorm_forward<float, 4>"],
    "reduce.cu": ["reduce_sum<float, 256>", "reduce_sum<int, 256>", "reduce_sum<double, 128>",
                  "argmin_int<256>"],
}
TARGETS = [("sm_80", "cubin"), ("sm_90", "cubin"), ("compute_80", "ptx")]


def _compile(src: str, **kw):
    kw.setdefault("arch", "sm_80")
    return kjit.compile(src, cache=False, **kw)


def _ptx(src: str, **kw) -> str:
    return _compile(src, arch="compute_80", target="ptx", **kw).code.decode()


@pytest.mark.parametrize("arch,target", TARGETS)
@pytest.mark.parametrize("fname", sorted(NAME_EXPRESSIONS))
def test_nvcc_style_kernels_compile_unchanged(fname, arch, target):
    source = (KERNELS / fname).read_text()   # exactly as an nvcc user wrote it
    assert "#include <c" in source
    obj = _compile(source, arch=arch, target=target, name=fname,
                   name_expressions=NAME_EXPRESSIONS[fname])
    assert obj.kind == target
    assert set(obj.symbols) == set(NAME_EXPRESSIONS[fname])
    for lowered in obj.symbols.values():
        assert lowered in obj.entry_points


@pytest.mark.parametrize("header", sorted(stdheaders.provided()))
def test_each_header_compiles_on_its_own(header):
    _compile(f"#include <{header}>\n__global__ void k(uint* p) {{ p[0] = 1u; }}\n")


@pytest.mark.parametrize("arch,target,std", [("sm_80", "cubin", None), ("sm_90", "cubin", "c++20"),
                                             ("compute_90", "ptx", None)])
def test_all_headers_together_in_both_orders(arch, target, std):
    names = sorted(stdheaders.provided())
    for order in (names, names[::-1]):
        src = "".join(f"#include <{n}>\n" for n in order) + "__global__ void k() {}\n"
        _compile(src, arch=arch, target=target, options=CompileOptions(std=std))


# What nvcc code expects of the names, checked by the compiler itself.
SEMANTICS = r'''
#include <cstdint>
#include <cstddef>
#include <climits>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <type_traits>
#include <limits>
#include <utility>
#include <tuple>
#include <array>
#include <algorithm>
#include <cuda_fp16.h>

static_assert(sizeof(uint) == 4 && sizeof(ushort) == 2 && sizeof(ulong) == 8, "glibc typedefs");
static_assert(std::is_same<std::int64_t, int64_t>::value && sizeof(std::uint8_t) == 1, "");
static_assert(std::is_same<std::size_t, size_t>::value, "");
static_assert(INT_MAX == 2147483647 && LLONG_MAX == 9223372036854775807LL && CHAR_BIT == 8, "");
static_assert(UINT32_MAX == 4294967295u && INT64_MIN < 0, "");
static_assert(std::numeric_limits<float>::max() == FLT_MAX, "");
static_assert(std::numeric_limits<int>::max() == INT_MAX, "");
static_assert(std::is_same<std::numeric_limits<float>, cuda::std::numeric_limits<float>>::value, "");
static_assert(std::is_same_v<std::remove_cv_t<const int>, int> && std::is_integral_v<uint>, "");
static_assert(std::tuple_size<std::tuple<int, float, char>>::value == 3, "");
static_assert(std::is_same<std::array<float, 4>, cuda::std::array<float, 4>>::value, "");
static_assert(std::min(3, 4) == 3 && std::max({1, 7, 2}) == 7 && std::clamp(9, 0, 5) == 5, "");
static_assert(EXIT_SUCCESS == 0 && M_PI > 3.14159 && M_PI < 3.1416, "");

__global__ void k(float f, double d, int i, long l, __half h, float* out) {
  // std::f is NVRTC's own ::f for float and double; other argument types go to cuda::std
  static_assert(std::is_same<decltype(std::sqrt(f)), float>::value, "");
  static_assert(std::is_same<decltype(std::sqrt(d)), double>::value, "");
  static_assert(std::is_same<decltype(std::sqrt(i)), double>::value, "integers -> double");
  static_assert(std::is_same<decltype(std::pow(f, d)), double>::value, "mixed -> double");
  static_assert(std::is_same<decltype(std::abs(i)), int>::value, "");
  static_assert(std::is_same<decltype(std::abs(l)), long>::value, "");
  static_assert(std::is_same<decltype(std::abs(h)), __half>::value, "");
  out[0] = std::exp(f) + std::fabs(f) + std::fmax(i, f) + std::lerp(f, 1.0f, 0.5f)
         + std::isnan(i) + std::fpclassify(f) + std::isless(f, d) + HUGE_VALF + INFINITY;
  {
    using namespace std;   // unqualified calls stay unambiguous next to NVRTC's global functions
    out[1] = sqrt(f) + exp(f) + pow(f, 2) + abs(f) + fabs(f) + floor(d) + isnan(f) + min(f, 1.0f)
           + max(i, 2) + ldexp(f, i) + round(f) + sqrtf(f);
  }
  std::pair<int, float> p = std::make_pair(1, 2.0f);
  auto [a, b] = p;
  auto t = std::make_tuple(1, 2.0f);
  std::swap(a, i);
  std::array<float, 2> arr{1.0f, 2.0f};
  auto [x0, x1] = arr;
  out[2] = a + b + std::get<1>(t) + x0 + x1 + std::move(f) + std::forward<float&>(f);
  char buf[8];
  std::memcpy(buf, "kjit", 5);
  std::memset(out + 3, 0, sizeof(float));
  out[4] = std::strlen(buf) + memcmp(buf, "kjit", 4) + std::div(7, 2).rem + labs(-l);
  void* heap = std::malloc(16);
  std::free(heap);
  if (i == 42) std::printf("%d %s\n", i, buf);
}
'''


def test_std_names_behave_as_nvcc_code_expects():
    _compile(SEMANTICS, arch="sm_80")


def test_assert_follows_ndebug_where_cassert_is_included():
    body = "__global__ void k(int x) { assert(x > 0); }\n"
    assert "__assertfail" in _ptx("#include <cassert>\n" + body)
    assert "__assertfail" not in _ptx("#define NDEBUG\n#include <cassert>\n" + body)
    assert "__assertfail" not in _ptx("#include <assert.h>\n" + body,
                                      options=CompileOptions(defines={"NDEBUG": None}))
    # like the C library's header, including it again re-reads NDEBUG
    assert "__assertfail" in _ptx("#define NDEBUG\n#include <cassert>\n#undef NDEBUG\n"
                                  "#include <cassert>\n" + body)


def test_nvrtc_searches_in_memory_headers_before_include_dirs(tmp_path):
    """The measured fact behind shipping the set as the last -I directory, not in memory."""
    (tmp_path / "who.h").write_text("#define WHO 1\n")
    src = '#include <who.h>\n#if WHO != 2\n#error the -I file won\n#endif\n__global__ void k() {}\n'
    _compile(src, options=CompileOptions(include_dirs=[tmp_path], headers={"who.h": "#define WHO 2\n"}))


USER_CSTDINT = "#define USER_CSTDINT 1\ntypedef long long int64_t;\n"
NEEDS_USERS = "#include <cstdint>\n#ifndef USER_CSTDINT\n#error kjit's cstdint won\n#endif\n" \
              "__global__ void k(int64_t* p) { p[0] = 1; }\n"


def test_the_users_own_headers_win_over_kjits(tmp_path):
    (tmp_path / "cstdint").write_text(USER_CSTDINT)
    _compile(NEEDS_USERS, options=CompileOptions(include_dirs=[tmp_path]))
    _compile(NEEDS_USERS, options=CompileOptions(extra=[f"-I{tmp_path}"]))
    _compile(NEEDS_USERS, options=CompileOptions(headers={"cstdint": USER_CSTDINT}))
    with pytest.raises(CompileError, match="kjit's cstdint won"):
        _compile(NEEDS_USERS)


def test_the_set_is_searched_last(tmp_path):
    opts = CompileOptions(include_dirs=[tmp_path], extra=["-I/opt/other"])
    dirs = include_path.for_options(opts, "cuda").dirs
    toolkit = include_path.automatic_dirs(True, "cuda")
    assert toolkit and stdheaders.cccl_dir() in toolkit        # CCCL is the toolkit's already
    assert dirs == (str(tmp_path.resolve()), "/opt/other", *toolkit, stdheaders.STDINC)
    # without the toolkit's directories the set brings CCCL, just before its own
    alone = include_path.for_options(CompileOptions(toolkit_headers=False), "cuda")
    assert alone.dirs == alone.automatic_dirs == (stdheaders.cccl_dir(), stdheaders.STDINC)
    # a CCCL the user gives is searched where the user put it, not again
    mine = CompileOptions(include_dirs=[stdheaders.cccl_dir()], toolkit_headers=False)
    assert include_path.for_options(mine, "cuda").dirs == (stdheaders.cccl_dir(), stdheaders.STDINC)
    assert stdheaders.STDINC not in include_path.for_options(CompileOptions(std_headers=False), "cuda").dirs
    assert stdheaders.STDINC not in include_path.for_options(CompileOptions(), "hip").dirs
    # and NVRTC gets them in that order, last
    with pytest.raises(CompileError) as err:
        _compile("#include <nothing_has_this.h>\n", options=opts)
    flags = [f for f in err.value.options if f.startswith("-I")]
    assert flags == [f"-I{d}" for d in dirs]


def test_turning_the_set_off_fails_with_a_reason_and_changes_the_key():
    src = "#include <cstdint>\n__global__ void k(int64_t* p) { p[0] = 1; }\n"
    off = CompileOptions(std_headers=False)
    with pytest.raises(CompileError, match=r"<cstdint> \(kernel.cu, line 1\) is one of kjit's "
                                           r"device-side standard headers, which are turned off"):
        _compile(src, options=off)
    assert stdheaders.STDINC not in include_path.for_options(off, "cuda").dirs
    assert compile_key(src, arch="sm_80", options=off) != compile_key(src, arch="sm_80")
    with pytest.raises(kjit.InvalidOptionError, match="std_headers must be True or False"):
        CompileOptions(std_headers="yes")


@pytest.fixture
def stdinc_copy(tmp_path, monkeypatch):
    """kjit's headers copied where a test may edit them, and used in their place."""
    copy = tmp_path / "stdinc"
    shutil.copytree(stdheaders.STDINC, copy)
    os.utime(copy / "cstdint", (1_000_000_000, 1_000_000_000))  # old enough to trust its stat
    monkeypatch.setattr(stdheaders, "STDINC", str(copy))
    return copy


def test_an_edit_to_the_set_misses_for_the_compiles_that_read_it(stdinc_copy):
    uses = "#include <cstdint>\n__global__ void k(int64_t* p) { p[0] = 7; }\n"
    # (the scan ignores #if, so CCCL-based headers may count <cstdint> too: <cstdio> does not)
    other = '#include <cstdio>\n__global__ void k(int* p) { printf("%d", p[0]); }\n'
    before = compile_key(uses, arch="sm_80"), compile_key(other, arch="sm_80")
    first = kjit.compile(uses, arch="sm_80")
    assert kjit.compile(uses, arch="sm_80").cache_hit
    path = stdinc_copy / "cstdint"
    path.write_text(path.read_text() + "// a new version of kjit's <cstdint>\n")
    os.utime(path, (1_000_000_100, 1_000_000_100))
    after = compile_key(uses, arch="sm_80"), compile_key(other, arch="sm_80")
    assert after[0] != before[0] and after[1] == before[1]
    again = kjit.compile(uses, arch="sm_80")
    assert not again.cache_hit and again.code == first.code


def test_host_only_headers_say_so_with_file_and_line(tmp_path):
    with pytest.raises(CompileError) as err:
        _compile("#include <cstdint>\n\n#include <iostream>\n__global__ void k() {}\n")
    first = str(err.value).splitlines()[1]
    assert first.startswith("<iostream> (kernel.cu, line 3) is a host-only header: kjit compiles "
                            "device code only"), first
    (tmp_path / "util.cuh").write_text("#pragma once\n#include <vector>\n")
    with pytest.raises(CompileError, match=r"<vector> \(.*util.cuh, line 2\) is a host-only header"):
        _compile('#include "util.cuh"\n__global__ void k() {}\n',
                 options=CompileOptions(include_dirs=[tmp_path]))
    # guarded the usual way, the host-only include never reaches NVRTC
    _compile("#ifndef __CUDACC_RTC__\n#include <iostream>\n#endif\n#include <cstdio>\n"
             '__global__ void k() { printf("ok\\n"); }\n')


def test_cxx14_gets_a_reason_not_cccls_error():
    with pytest.raises(CompileError, match="needs C\\+\\+17 or later.*std_headers=False"):
        _compile("#include <cstdint>\n__global__ void k() {}\n", options=CompileOptions(std="c++14"))
    # the headers that do not need CCCL work in any dialect
    _compile("#include <cstdio>\n#include <cassert>\n__global__ void k(uint x) { assert(x); }\n",
             options=CompileOptions(std="c++11"))


def test_explain_missing_reads_nvrtc_logs():
    log = 'k.cu(4): catastrophic error: cannot open source file "memory"\n  #include <memory>\n'
    assert "<memory> (k.cu, line 4) is a host-only header" in stdheaders.explain_missing(log, True)
    log = 'k.cu(1): catastrophic error: could not open source file "thread" (no directories in search list)'
    assert "host threads" in stdheaders.explain_missing(log, False)
    log = f'{stdheaders.STDINC}/cstdint(7): catastrophic error: cannot open source file "cuda/std/cstdint"'
    assert "nvidia-cuda-cccl" in stdheaders.explain_missing(log, True)
    log = 'k.cu(1): catastrophic error: cannot open source file "my_header.h"'
    assert stdheaders.explain_missing(log, True) is None
    assert stdheaders.explain_missing('k.cu(2): error: identifier "x" is undefined', True) is None


def test_cli_compile_and_build_take_no_std_headers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.cu").write_text("#include <cstdint>\n#include <climits>\n"
                                   "__global__ void k(int64_t* p) { p[0] = INT_MAX; }\n")
    ok = CliRunner().invoke(cli, ["compile", "k.cu", "--arch", "sm_80"])
    assert ok.exit_code == 0, ok.output
    off = CliRunner().invoke(cli, ["compile", "k.cu", "--arch", "sm_80", "--no-std-headers"])
    assert off.exit_code == 1 and "std_headers=False" in off.output, off.output
    built = CliRunner().invoke(cli, ["build", "k.cu", "--arch", "sm_80", "--no-ptx", "-j", "1",
                                     "--no-std-headers"])
    assert built.exit_code == 1 and "turned off" in built.output, built.output


def test_a_device_assert_says_the_context_is_unusable():
    err = DriverError(710, "CUDA_ERROR_ASSERT", call="cuCtxSynchronize",
                      description="device-side assert triggered")
    assert err.context_unusable
    assert "A device-side assert fired" in str(err)
    assert "The CUDA context is now unusable" in str(err)
    busy = DriverError(46, "CUDA_ERROR_DEVICE_UNAVAILABLE", call="cuCtxCreate")
    assert not busy.context_unusable and "unusable" not in str(busy)


def test_an_error_inside_the_set_names_the_cccl_it_found():
    """Seen on the GPU machine with the CUDA 13.0 toolkit's CCCL 3.0: the set's own headers
    fail to compile; the error says which CCCL was found and what the set is tested with."""
    import os
    log = (f'{os.path.join(stdheaders.STDINC, "cmath")}(20): error: namespace "cuda::std" has '
           'no member "float_t"\n')
    note = stdheaders.explain_missing(log, True)
    assert "newer CCCL" in note and "CCCL 3.5" in note and "--no-std-headers" in note
    assert stdheaders.explain_missing(log, False) is None          # the set was off: not it
    assert stdheaders.explain_missing("kernel.cu(3): error: x\n", True) is None
