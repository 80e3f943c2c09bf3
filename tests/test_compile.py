"""kjit.compile through NVRTC on a machine with no GPU: the bytes of every target, the
options and what they do to the output, and every argument error (raised before compiling)."""
from __future__ import annotations

import re
import struct

import pytest

from kjit.compiler.targets import nvrtc_supported

import kjit
from kjit import arch as arch_mod
from kjit.compiler import nvrtc
from kjit.formats.elf import EM_CUDA, ET_EXEC, ET_REL, ElfFile
from kjit.errors import CompileError, InvalidOptionError

from conftest import SAXPY, TEMPLATE

# A kernel name chosen by the preprocessor: the entry point shows where a macro came from.
NAMED_BY_MACRO = r'''
#include "kname.h"
extern "C" __global__ void KNAME(float* x) { x[threadIdx.x] = 1.0f; }
'''

DIVIDE = r'''
extern "C" __global__ void divide(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] / a + sqrtf(x[i]);
}
'''

# Enough live values that ptxas wants well over 32 registers for it.
HEAVY = r'''
extern "C" __global__ void heavy(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc[24];
    #pragma unroll
    for (int k = 0; k < 24; ++k) acc[k] = x[i + k * n] / a + sinf(x[i] * k);
    float s = 0;
    #pragma unroll
    for (int k = 0; k < 24; ++k) s += acc[k] * acc[(k * 7) % 24];
    y[i] = s;
}
'''


def section_names(code: bytes) -> set[str]:
    return {s.name for s in ElfFile(code).sections}


def register_count(code: bytes, kernel: str) -> int:
    """EIATTR_REGCOUNT for `kernel` from the cubin's .nv.info section."""
    elf = ElfFile(code)
    index = next(i for i, s in enumerate(elf.symbols) if s.name == kernel)
    data = elf.section_bytes(elf.section(".nv.info"))
    off = 0
    while off + 4 <= len(data):
        fmt, attr, size = struct.unpack_from("<BBH", data, off)
        if fmt == 0x04:  # EIFMT_SVAL: a payload of `size` bytes follows
            if attr == 0x2F:  # EIATTR_REGCOUNT: (symbol index, count)
                sym, count = struct.unpack_from("<II", data, off + 4)
                if sym == index:
                    return count
            off += 4 + size
        else:
            off += 4
    raise AssertionError(f"no register count for {kernel}")


# --- each target, checked byte by byte -----------------------------------------------

@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_120"])
def test_cubin_is_a_cuda_elf_for_the_arch(arch):
    obj = kjit.compile(SAXPY, arch=arch, target="cubin")
    assert (obj.kind, obj.arch) == ("cubin", arch)
    code = obj.code
    assert code[:4] == b"\x7fELF" and code[4] == 2 and code[5] == 1  # ELF64, little-endian
    e_type, e_machine = struct.unpack_from("<HH", code, 16)
    assert (e_type, e_machine) == (ET_EXEC, EM_CUDA) and EM_CUDA == 190
    assert ElfFile(code).cuda_sm == int(arch[3:])  # e_flags carry the SM number
    assert obj.entry_points == ("saxpy",)


def test_cubin_is_the_default_target():
    obj = kjit.compile(SAXPY, arch="sm_90")
    assert obj.kind == "cubin" and obj.code.startswith(b"\x7fELF")


def test_ptx_targets_the_arch_and_names_the_entry():
    obj = kjit.compile(SAXPY, arch="sm_90", target="ptx")
    text = obj.code.decode()
    assert (obj.kind, obj.arch) == ("ptx", "compute_90")  # PTX is virtual-arch code
    assert re.search(r"^\.target sm_90\b", text, re.M)
    assert re.search(r"^\.version \d+\.\d+", text, re.M)
    assert re.search(r"\.entry saxpy\(", text)
    assert not obj.code.endswith(b"\0")  # the NUL NVRTC counts is not part of the text
    assert obj.entry_points == ("saxpy",)


def test_virtual_arch_gives_ptx_for_that_arch():
    obj = kjit.compile(SAXPY, arch="compute_90", target="ptx")
    assert obj.arch == "compute_90"
    assert re.search(rb"^\.target sm_90\b", obj.code, re.M)


def test_ltoir_has_the_nvvm_magic():
    obj = kjit.compile(SAXPY, arch="sm_90", target="ltoir")
    assert (obj.kind, obj.arch) == ("ltoir", "sm_90")
    assert struct.unpack_from("<I", obj.code)[0] == 0x7F4E43ED


def test_arch_specific_target_compiles():
    obj = kjit.compile(SAXPY, arch="sm_90a")
    assert obj.arch == "sm_90a" and ElfFile(obj.code).cuda_sm == 90


def test_result_records_compiler_and_options():
    opts = kjit.CompileOptions(fast_math=True)
    obj = kjit.compile(SAXPY, arch="sm_90", options=opts)
    major, minor = nvrtc.version()
    assert obj.metadata["compiler"] == f"nvrtc {major}.{minor}"
    assert obj.metadata["options"] == opts.describe()
    assert obj.name == "kernel.cu"
    assert kjit.compile(SAXPY, arch="sm_90", name="saxpy.cu").name == "saxpy.cu"


def test_warnings_are_kept_in_the_log():
    src = 'extern "C" __global__ void k(float* x) { int unused; x[0] = 1; }'
    obj = kjit.compile(src, arch="sm_90", target="ptx", name="warn.cu")
    assert "warn.cu(1): warning" in obj.log and "unused" in obj.log
    assert kjit.compile(SAXPY, arch="sm_90").log == ""


def test_empty_log_does_not_corrupt_python_bytes():
    # An empty NVRTC log is one NUL byte; writing it into `b" " * 1` used to overwrite
    # CPython's shared b" " object, so every b" " in the process became b"\x00".
    kjit.compile(SAXPY, arch="sm_90", target="ptx")
    assert " ".encode()[0] == 0x20
    assert b"a b".split(b" ") == [b"a", b"b"]


# --- name expressions -----------------------------------------------------------------

def test_name_expressions_map_to_mangled_symbols():
    obj = kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["axpy<float>", "axpy<double>"])
    assert obj.symbols["axpy<float>"] == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert obj.symbols["axpy<double>"] == "_Z4axpyIdEvT_PKS0_PS0_i"
    assert set(obj.entry_points) == set(obj.symbols.values())
    assert obj.lowered_name("axpy<float>") == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert obj.lowered_name("saxpy") == "saxpy"


def test_name_expressions_in_ptx():
    obj = kjit.compile(TEMPLATE, arch="sm_90", target="ptx", name_expressions=("axpy<int>",))
    assert obj.entry_points == (obj.symbols["axpy<int>"],)
    assert obj.symbols["axpy<int>"].startswith("_Z4axpyIi")


def test_unknown_name_expression_is_a_compile_error():
    with pytest.raises(CompileError, match="banana"):
        kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["axpy<banana>"])


# --- headers, include dirs, defines ---------------------------------------------------

def test_in_memory_headers():
    opts = kjit.CompileOptions(headers={"kname.h": "#define KNAME from_memory\n"})
    assert kjit.compile(NAMED_BY_MACRO, arch="sm_90", options=opts).entry_points == ("from_memory",)
    with pytest.raises(CompileError, match="kname.h"):
        kjit.compile(NAMED_BY_MACRO, arch="sm_90")


def test_include_dirs(tmp_path):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "kname.h").write_text("#define KNAME from_dir\n")
    for dirs in ([inc], [str(inc)]):
        opts = kjit.CompileOptions(include_dirs=dirs)
        assert kjit.compile(NAMED_BY_MACRO, arch="sm_90", options=opts).entry_points == ("from_dir",)


def test_in_memory_header_is_found_before_include_dirs(tmp_path):
    (tmp_path / "kname.h").write_text("#define KNAME from_dir\n")
    opts = kjit.CompileOptions(include_dirs=[tmp_path], headers={"kname.h": "#define KNAME from_memory\n"})
    assert kjit.compile(NAMED_BY_MACRO, arch="sm_90", options=opts).entry_points == ("from_memory",)


@pytest.mark.parametrize("defines", [{"KNAME": "from_define"}, ["KNAME=from_define"],
                                     [("KNAME", "from_define")]])
def test_defines_with_values(defines):
    opts = kjit.CompileOptions(defines=defines, headers={"kname.h": ""})
    assert kjit.compile(NAMED_BY_MACRO, arch="sm_90", options=opts).entry_points == ("from_define",)


def test_define_without_value():
    src = r'''
    #ifdef WIDE
    extern "C" __global__ void wide(double* x) { x[0] = 1; }
    #else
    extern "C" __global__ void narrow(float* x) { x[0] = 1; }
    #endif
    '''
    assert kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(defines=["WIDE"])).entry_points == ("wide",)
    assert kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(defines={"WIDE": None})).entry_points == ("wide",)
    assert kjit.compile(src, arch="sm_90").entry_points == ("narrow",)


def test_std_selects_the_dialect():
    src = "__device__ auto twice(int v) { return 2 * v; }\n" \
          'extern "C" __global__ void k(int* x) { x[0] = twice(x[0]); }\n'
    kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(std="c++14"))
    with pytest.raises(CompileError, match="trailing return type"):
        kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(std="c++11"))


# --- code-generation options ----------------------------------------------------------

def test_relocatable_gives_a_relocatable_object():
    src = r'''
    extern __device__ float helper(float);
    extern "C" __global__ void k(float* x) { x[0] = helper(x[0]); }
    '''
    # An external device function needs separate compilation...
    with pytest.raises(CompileError):
        kjit.compile(src, arch="sm_90")
    obj = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(relocatable=True))
    # ...and gives an ET_REL cubin, kind "object", left for the linker to complete.
    assert struct.unpack_from("<H", obj.code, 16)[0] == ET_REL
    assert obj.kind == "object" and obj.arch == "sm_90"
    assert obj.entry_points == ("k",)
    plain = kjit.compile(SAXPY, arch="sm_90")
    assert struct.unpack_from("<H", plain.code, 16)[0] == ET_EXEC


def test_fast_math_uses_approximate_flush_to_zero_math():
    base = kjit.compile(DIVIDE, arch="sm_90", target="ptx").code.decode()
    fast = kjit.compile(DIVIDE, arch="sm_90", target="ptx",
                        options=kjit.CompileOptions(fast_math=True)).code.decode()
    assert "div.rn.f32" in base and "sqrt.rn.f32" in base and ".ftz" not in base
    assert "div.approx.ftz.f32" in fast and "sqrt.approx.ftz.f32" in fast


LOC = re.compile(r"^\s*\.loc\s", re.M)


def test_line_info():
    base_ptx = kjit.compile(DIVIDE, arch="sm_90", target="ptx").code.decode()
    ptx = kjit.compile(DIVIDE, arch="sm_90", target="ptx",
                       options=kjit.CompileOptions(line_info=True)).code.decode()
    assert LOC.search(ptx) and not LOC.search(base_ptx)
    cubin = kjit.compile(DIVIDE, arch="sm_90", options=kjit.CompileOptions(line_info=True))
    assert ".debug_line" in section_names(cubin.code)
    assert ".debug_info" not in section_names(cubin.code)  # line info is not full debug
    assert ".debug_line" not in section_names(kjit.compile(DIVIDE, arch="sm_90").code)


def test_debug():
    cubin = kjit.compile(DIVIDE, arch="sm_90", options=kjit.CompileOptions(debug=True))
    assert {".debug_info", ".debug_line"} <= section_names(cubin.code)
    assert ".debug_info" not in section_names(kjit.compile(DIVIDE, arch="sm_90").code)
    ptx = kjit.compile(DIVIDE, arch="sm_90", target="ptx", options=kjit.CompileOptions(debug=True))
    assert re.search(rb"\.section\s+\.debug_info", ptx.code)


def test_max_registers_caps_register_use():
    free = register_count(kjit.compile(HEAVY, arch="sm_90").code, "heavy")
    capped = register_count(kjit.compile(HEAVY, arch="sm_90",
                                         options=kjit.CompileOptions(max_registers=32)).code, "heavy")
    assert free > 32 >= capped


def test_extra_flags_reach_nvrtc():
    opts = kjit.CompileOptions(extra=["--no-such-nvrtc-flag"])
    with pytest.raises(CompileError, match="no-such-nvrtc-flag") as info:
        kjit.compile(SAXPY, arch="sm_90", options=opts)
    assert "--no-such-nvrtc-flag" in info.value.options


# --- every argument error, raised before NVRTC runs -----------------------------------

@pytest.fixture
def no_compiling(monkeypatch):
    """Fail the test if NVRTC would be run."""
    def refuse(*args, **kwargs):
        raise AssertionError("NVRTC ran: the argument error was not caught before compiling")
    monkeypatch.setattr(nvrtc, "compile_source", refuse)


def unsupported_sm() -> str:
    # NVRTC 13 dropped sm_50..sm_72, NVRTC 12 targets them all but dropped Kepler (sm_37)
    return next(f"sm_{n}" for n in (50, 52, 60, 61, 70, 72, 37) if n not in nvrtc_supported())


@pytest.mark.parametrize("kwargs, words", [
    (dict(arch="sm_91"), ["sm_91", "supports", "sm_90"]),
    (dict(arch="sm_90", target="exe"), ["exe", "ptx", "cubin", "ltoir"]),
    (dict(arch="compute_90", target="cubin"), ["cubin", "sm_90", "compute_90"]),
    (dict(arch="compute_90"), ["cubin", "sm_90"]),                      # cubin is the default
    (dict(arch="volta"), ["volta", "sm_XY"]),
    (dict(arch="sm_90", backend="metal"), ["metal", "cuda", "hip"]),
    (dict(arch="sm_90", name_expressions="axpy<float>"), ["list"]),
    (dict(arch="sm_90", name_expressions=[""]), ["name expression"]),
    (dict(arch="sm_90", options={"fast_math": True}), ["CompileOptions"]),
])
def test_argument_errors(no_compiling, kwargs, words):
    with pytest.raises(InvalidOptionError) as info:
        kjit.compile(SAXPY, **kwargs)
    for w in words:
        assert w in str(info.value)


def test_arch_nvrtc_does_not_support_lists_the_supported_ones(no_compiling):
    with pytest.raises(InvalidOptionError) as info:
        kjit.compile(SAXPY, arch=unsupported_sm())
    msg = str(info.value)
    assert "not supported by the installed NVRTC" in msg
    assert ", ".join(f"sm_{n}" for n in nvrtc_supported()) in msg


@pytest.mark.parametrize("source", [None, 42, ["x"]])
def test_source_must_be_a_string(no_compiling, source):
    with pytest.raises(InvalidOptionError, match="source must be a string"):
        kjit.compile(source, arch="sm_90")


def test_source_as_utf8_bytes_is_accepted():
    assert kjit.compile(SAXPY.encode(), arch="sm_90", target="ptx").entry_points == ("saxpy",)


@pytest.mark.parametrize("kwargs, words", [
    (dict(std="c++98"), ["c++98", "c++17"]),
    (dict(std="gnu++17"), ["gnu++17"]),
    (dict(defines=["1ST"]), ["1ST", "macro name"]),
    (dict(defines={"A-B": "1"}), ["A-B"]),
    (dict(defines=["A B"]), ["A B"]),
    (dict(defines="NDEBUG"), ["list"]),
    (dict(include_dirs=["/no/such/kjit/dir"]), ["/no/such/kjit/dir", "does not exist"]),
    (dict(include_dirs="/usr/include"), ["list"]),
    (dict(headers=["a.h"]), ["mapping"]),
    (dict(headers={"a.h": 1}), ["a.h"]),
    (dict(fast_math="yes"), ["fast_math"]),
    (dict(max_registers=0), ["max_registers"]),
    (dict(max_registers=256), ["max_registers"]),
    (dict(max_registers=True), ["max_registers"]),
    (dict(extra="--use_fast_math"), ["list"]),
])
def test_option_errors(kwargs, words):
    with pytest.raises(InvalidOptionError) as info:
        kjit.CompileOptions(**kwargs)
    for w in words:
        assert w in str(info.value)


def test_missing_include_dir_is_reported_with_its_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(InvalidOptionError, match="nope"):
        kjit.CompileOptions(include_dirs=[missing])


@pytest.mark.parametrize("flag", ["-arch=sm_80", "-arch sm_80", "--gpu-architecture=sm_80",
                                  "-rdc=true", "--relocatable-device-code=true", "-dlto",
                                  "-std=c++14", "--std=c++14"])
def test_reserved_extra_flags(flag):
    with pytest.raises(InvalidOptionError, match="set by kjit itself"):
        kjit.CompileOptions(extra=[flag])


def test_options_are_normalised_and_immutable(tmp_path):
    opts = kjit.CompileOptions(defines={"B": 2, "A": None}, include_dirs=[tmp_path],
                               headers={"z.h": b"", "a.h": "x"})
    assert opts.defines == (("B", "2"), ("A", None))
    assert opts.include_dirs == (str(tmp_path.resolve()),)
    assert list(opts.headers) == ["a.h", "z.h"] and opts.headers["z.h"] == ""
    with pytest.raises(AttributeError):
        opts.fast_math = True  # type: ignore[misc]
    assert opts.replace(fast_math=True).fast_math and not opts.fast_math


# --- arch=None -----------------------------------------------------------------------

def test_no_arch_and_no_gpu_says_how_to_pass_one(monkeypatch, no_compiling):
    monkeypatch.setattr(arch_mod, "device_arch", lambda ordinal=None: None)
    with pytest.raises(InvalidOptionError) as info:
        kjit.compile(SAXPY)
    msg = str(info.value)
    assert "arch='sm_90'" in msg and "KJIT_ARCH" in msg


def test_kjit_arch_environment_is_used_when_no_gpu(monkeypatch):
    monkeypatch.setattr(arch_mod, "device_arch", lambda ordinal=None: None)
    monkeypatch.setenv("KJIT_ARCH", "sm_89")
    obj = kjit.compile(SAXPY)
    assert obj.arch == "sm_89" and ElfFile(obj.code).cuda_sm == 89


@pytest.mark.gpu
def test_no_arch_compiles_for_the_current_device():
    from kjit import driver
    major, minor = driver.compute_capability(driver.current_device())
    obj = kjit.compile(SAXPY)
    assert obj.arch == f"sm_{major}{minor}" and ElfFile(obj.code).cuda_sm == major * 10 + minor


def test_a_source_holding_a_lone_surrogate_is_refused_naming_where():
    """A file read with errors='surrogateescape' keeps its non-UTF-8 bytes as lone surrogates;
    no compiler can be given such text: refused before compiling, naming line and column
    (it raised a raw UnicodeEncodeError)."""
    import kjit
    from kjit.errors import InvalidOptionError
    src = 'extern "C" __global__ void k(float* x) { x[0] = 1; }\n// caf\udce9\n'
    with pytest.raises(InvalidOptionError, match=r"line 2, column 7 holds U\+DCE9"):
        kjit.compile(src, arch="sm_90")
