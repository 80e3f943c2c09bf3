"""kjit.link on a machine with no GPU: nvJitLink, inputs, errors, device runtime, cache, CLI."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import kjit
from kjit.formats.elf import ElfFile
from kjit.errors import CudaUnavailableError, InvalidOptionError, LinkError
from kjit.linker import LinkOptions, LinkResult, devrt, link
from kjit.linker.choice import (choose_backend, cuda_version_for_ptx, max_ptx_for_driver,
                                ptx_too_new)
from kjit.linker import ptx_to_cubin

ARCH = "sm_90"
RDC = kjit.CompileOptions(relocatable=True)

# Two modules that call each other: ping (in A) calls pong (in B), the kernel (in B) calls ping.
MOD_A = r'''
extern "C" __device__ int pong(int x);
extern "C" __device__ int ping(int x) { return x > 0 ? pong(x - 1) + 1 : 0; }
'''
MOD_B = r'''
extern "C" __device__ int ping(int x);
extern "C" __device__ int pong(int x) { return x > 0 ? ping(x - 1) + 10 : 0; }
extern "C" __global__ void bounce(int* out) { out[threadIdx.x] = ping(threadIdx.x); }
'''
LIB = r'''extern "C" __device__ float twice(float x) { return 2.0f * x; }'''
MAIN = r'''
extern "C" __device__ float twice(float x);
extern "C" __global__ void doubler(float* y) { y[threadIdx.x] = twice(y[threadIdx.x]); }
'''
DEVICE_LAUNCH = r'''
extern "C" __global__ void child(int* p) { p[threadIdx.x] += 1; }
extern "C" __global__ void parent(int* p) { if (threadIdx.x == 0) child<<<1, 32>>>(p); }
'''


def ptx(src: str, name: str) -> kjit.ObjectCode:
    return kjit.compile(src, arch=ARCH, target="ptx", options=RDC, name=name)


def defined(code: bytes) -> set[str]:
    return {s.name for s in ElfFile(code).symbols if s.shndx != 0 and s.name}


def undefined(code: bytes) -> set[str]:
    return {s.name for s in ElfFile(code).symbols if s.shndx == 0 and s.name and s.bind == 1}


# --- linking with nvJitLink -----------------------------------------------------------

def test_two_relocatable_ptx_modules_calling_each_other_link_to_one_cubin():
    a, b = ptx(MOD_A, "a.cu"), ptx(MOD_B, "b.cu")
    res = link([a, b], arch=ARCH, backend="nvjitlink")
    assert isinstance(res, LinkResult)
    assert res.backend == "nvjitlink" and res.object.kind == "cubin" and res.arch == ARCH
    assert res.code.startswith(b"\x7fELF")
    elf = ElfFile(res.code)
    assert elf.cuda_sm == 90 and elf.type == 2  # an executable cubin, not a relocatable one
    assert res.object.entry_points == ("bounce",)
    # Both cross-module calls were resolved: the functions are defined, none left undefined.
    assert {"ping", "pong", "bounce"} <= defined(res.code)
    assert not {"ping", "pong"} & undefined(res.code)
    assert res.wall_time_ms > 0
    assert res.object.metadata["inputs"] == ["a.ptx", "b.ptx"]


def test_lto_ir_links_with_lto_turned_on_for_it():
    la = kjit.compile(LIB, arch=ARCH, target="ltoir", options=RDC, name="lib.cu")
    lb = kjit.compile(MAIN, arch=ARCH, target="ltoir", options=RDC, name="main.cu")
    res = link([la, lb], arch=ARCH, options=LinkOptions(verbose=True))
    assert res.backend == "nvjitlink" and "LTO-IR" in res.reason
    assert res.object.metadata["lto"] is True
    assert res.object.entry_points == ("doubler",)
    assert "doubler" in res.info_log  # -verbose: ptxas reports the kernel it compiled


def test_lto_with_fast_math_and_optimization_level_flags():
    from kjit.linker.nvjitlink import flags
    opts = LinkOptions(fast_math=True, optimization_level=0, max_registers=32, line_info=True)
    assert flags("sm_90", opts, lto=True) == [
        "-arch=sm_90", "-lto", "-maxrregcount=32", "-Xptxas=-O0", "-O0", "-lineinfo",
        "-ftz=1", "-prec-div=0", "-prec-sqrt=0", "-fma=1"]
    la = kjit.compile(LIB, arch=ARCH, target="ltoir", options=RDC)
    lb = kjit.compile(MAIN, arch=ARCH, target="ltoir", options=RDC)
    assert link([la, lb], arch=ARCH, options=opts).object.entry_points == ("doubler",)


def test_fast_math_without_lto_is_refused_before_linking():
    with pytest.raises(InvalidOptionError, match="LTO"):
        link([ptx(MAIN, "m.cu")], arch=ARCH, options=LinkOptions(fast_math=True))


def test_cubin_and_ptx_inputs_mix():
    a = kjit.compile(LIB, arch=ARCH, target="cubin", options=RDC, name="lib.cu")
    res = link([a, ptx(MAIN, "main.cu")], arch=ARCH, backend="nvjitlink")
    assert res.object.entry_points == ("doubler",)
    assert "twice" in defined(res.code)


def test_fatbin_input():
    from cuda.bindings import nvfatbin
    cub = kjit.compile(LIB, arch=ARCH, target="cubin", options=RDC)
    h = nvfatbin.create([], 0)
    nvfatbin.add_cubin(h, cub.code, len(cub.code), "90", "lib")
    buf = bytearray(nvfatbin.size(h))
    nvfatbin.get(h, buf)
    nvfatbin.destroy(h)
    res = link([bytes(buf), ptx(MAIN, "main.cu")], arch=ARCH, backend="nvjitlink")
    assert res.object.metadata["inputs"][0].endswith(".fatbin")
    assert "twice" in defined(res.code)


def test_arch_comes_from_the_inputs_when_no_gpu_and_no_env(monkeypatch):
    from kjit import driver
    if driver.available():
        pytest.skip("a GPU is present: the device's arch is used")
    assert link([ptx(LIB, "l.cu"), ptx(MAIN, "m.cu")]).arch == "sm_90"
    monkeypatch.setenv("KJIT_ARCH", "sm_100")  # $KJIT_ARCH comes before the inputs' arch
    assert link([ptx(LIB, "l.cu"), ptx(MAIN, "m.cu")]).arch == "sm_100"


def test_no_arch_anywhere_says_how_to_choose_one():
    from kjit import driver
    if driver.available():
        pytest.skip("a GPU is present: the device's arch is used")
    a = kjit.compile(LIB, arch="sm_80", target="ptx", options=RDC)
    b = kjit.compile(MAIN, arch="sm_90", target="ptx", options=RDC)
    with pytest.raises(InvalidOptionError, match=r"arch='sm_90'.*KJIT_ARCH|KJIT_ARCH"):
        link([a, b])


# --- errors ---------------------------------------------------------------------------

def test_undefined_symbol_names_the_symbol_and_the_inputs():
    with pytest.raises(LinkError) as info:
        link([ptx(MAIN, "main.cu"), ptx(LIB.replace("twice", "thrice"), "lib.cu")], arch=ARCH,
             backend="nvjitlink")
    err = info.value
    assert err.symbol == "twice"
    assert err.inputs == ("main.ptx", "lib.ptx")
    # nvJitLink's log blames the last input added (lib.ptx); kjit reads the inputs and names
    # the one that uses the symbol.
    assert err.input_name == "main.ptx"
    text = str(err)
    assert "undefined symbol twice referenced from main.ptx" in text
    assert "inputs: main.ptx, lib.ptx" in text
    assert "Undefined reference to 'twice'" in err.error_log  # the linker's own log, whole
    assert err.backend == "nvjitlink"


def test_mangled_undefined_symbol_gets_an_extern_c_hint():
    src = '__device__ float helper(float);\nextern "C" __global__ void k(float* y) { y[0] = helper(y[0]); }'
    with pytest.raises(LinkError, match='extern "C"') as info:
        link([ptx(src, "k.cu")], arch=ARCH, backend="nvjitlink")
    assert info.value.symbol == "_Z6helperf"


def test_bad_ptx_names_the_failing_input_and_keeps_the_log():
    good = ptx(LIB, "lib.cu")
    broken = kjit.ObjectCode(ptx(MAIN, "main.cu").code.replace(b"ret;", b"frobnicate.u32 %r1;"),
                             kind="ptx", name="main.cu")
    with pytest.raises(LinkError) as info:
        link([good, broken], arch=ARCH, backend="nvjitlink")
    err = info.value
    assert err.input_name == "main.ptx"
    assert "Not a name of any known instruction: 'frobnicate'" in err.error_log
    assert "failing input: main.ptx" in str(err)


def test_garbage_bytes_are_refused_naming_the_input():
    with pytest.raises(InvalidOptionError, match=r"link input #1 \(bytes\).*unrecognised"):
        link([ptx(LIB, "lib.cu"), b"this is not code at all"], arch=ARCH)


def test_host_program_is_refused_as_an_object_without_device_code(tmp_path):
    exe = Path(shutil.which("true") or "/bin/true")
    if not exe.exists() or not exe.read_bytes().startswith(b"\x7fELF"):
        pytest.skip("no host ELF binary to try")
    with pytest.raises(InvalidOptionError, match="no device code"):
        link([exe], arch=ARCH)


def test_other_bad_inputs():
    with pytest.raises(InvalidOptionError, match="nothing to link"):
        link([], arch=ARCH)
    with pytest.raises(InvalidOptionError, match=r"link input #0: .*CUDA C\+\+ source.*kjit.compile"):
        link([MAIN], arch=ARCH)
    with pytest.raises(InvalidOptionError, match="no such file"):
        link(["/nonexistent/x.ptx"], arch=ARCH)
    with pytest.raises(InvalidOptionError, match="pass kjit.ObjectCode, a cuda.core ObjectCode, bytes, PTX text or a file"):
        link([42], arch=ARCH)
    with pytest.raises(InvalidOptionError, match="backend="):
        link([ptx(LIB, "l.cu")], arch=ARCH, backend="lld")
    with pytest.raises(InvalidOptionError, match="not a CUDA architecture"):
        link([ptx(LIB, "l.cu")], arch="gfx90a")


def test_cubin_for_another_arch_says_so():
    old = kjit.compile(LIB, arch="sm_80", target="cubin", options=RDC, name="old.cu")
    with pytest.raises(LinkError, match=r"old.cubin is code for sm_80, the link targets sm_90"):
        link([old, ptx(MAIN, "main.cu")], arch=ARCH, backend="nvjitlink")


def test_link_options_are_validated():
    with pytest.raises(InvalidOptionError, match="max_registers"):
        LinkOptions(max_registers=0)
    with pytest.raises(InvalidOptionError, match="optimization_level"):
        LinkOptions(optimization_level=7)
    with pytest.raises(InvalidOptionError, match="set by kjit"):
        LinkOptions(extra=["-arch=sm_80"])
    with pytest.raises(InvalidOptionError, match="list of nvJitLink flags"):
        LinkOptions(extra="-g")
    with pytest.raises(InvalidOptionError, match="device_runtime"):
        LinkOptions(device_runtime="yes")
    with pytest.raises(InvalidOptionError, match="kjit.LinkOptions"):
        link([ptx(LIB, "l.cu")], arch=ARCH, options={"verbose": True})


def test_unknown_nvjitlink_flag_is_a_link_error_naming_the_flags():
    with pytest.raises(LinkError, match="-no-such-flag"):
        link([ptx(LIB, "l.cu")], arch=ARCH, options=LinkOptions(extra=["-no-such-flag"]))


# --- files and archives ---------------------------------------------------------------

def test_file_inputs_by_str_and_path(tmp_path):
    a, b = ptx(MOD_A, "a.cu"), ptx(MOD_B, "b.cu")
    pa, pb = a.save(tmp_path / "a.ptx"), b.save(tmp_path / "b.ptx")
    res = link([str(pa), pb], arch=ARCH, backend="nvjitlink")
    assert res.object.entry_points == ("bounce",)
    assert res.object.metadata["inputs"] == [str(pa), str(pb)]
    # The same bytes from memory give the same cache key: the file link was a cache hit.
    assert link([a, b], arch=ARCH, backend="nvjitlink").cache_hit is True


def test_failing_file_input_is_named_by_its_path(tmp_path):
    pm = ptx(MAIN, "main.cu").save(tmp_path / "main.ptx")
    with pytest.raises(LinkError) as info:
        link([pm], arch=ARCH, backend="nvjitlink")
    assert str(pm) in info.value.inputs and info.value.symbol == "twice"


def _devrt_or_skip() -> Path:
    path = devrt.find()
    if path is None:
        pytest.skip("libcudadevrt.a not installed (pip install nvidia-cuda-runtime)")
    return path


def test_archive_input_from_a_path(tmp_path):
    lib = _devrt_or_skip()
    copy = tmp_path / "libdevrt_copy.a"
    copy.write_bytes(lib.read_bytes())
    res = link([ptx(DEVICE_LAUNCH, "launch.cu"), copy], arch=ARCH, backend="nvjitlink",
               options=LinkOptions(device_runtime=False))
    assert res.object.metadata["inputs"][1] == str(copy)
    assert {"parent", "child"} <= set(res.object.entry_points)
    assert res.device_runtime is None  # the archive was the user's input, not added by kjit


def test_host_object_input(tmp_path):
    lib = _devrt_or_skip()
    data = lib.read_bytes()
    assert data.startswith(b"!<arch>\n")
    # The archive's object member (after its symbol table): a host object with device code.
    pos, member = 8, b""
    while pos < len(data):
        name, size = data[pos:pos + 16].strip(), int(data[pos + 48:pos + 58].decode().strip())
        if name not in (b"/", b"//"):
            member = data[pos + 60:pos + 60 + size]
            break
        pos += 60 + size + (size & 1)
    assert member.startswith(b"\x7fELF")
    res = link([ptx(DEVICE_LAUNCH, "launch.cu"), member], arch=ARCH, backend="nvjitlink",
               options=LinkOptions(device_runtime=False))
    assert res.object.metadata["inputs"][1].endswith(".o")
    assert "parent" in res.object.entry_points


# --- device runtime -------------------------------------------------------------------

def test_device_launch_is_detected_in_ptx_and_cubin():
    p = ptx(DEVICE_LAUNCH, "launch.cu")
    c = kjit.compile(DEVICE_LAUNCH, arch=ARCH, target="cubin", options=RDC)
    refs = devrt.references(p.code, "ptx")
    assert refs and any("Launch" in r for r in refs)
    assert devrt.references(c.code, "cubin") == refs
    assert devrt.references(ptx(MAIN, "m.cu").code, "ptx") == []
    assert devrt.references(b"", "ltoir") is None


def _devrt_install() -> str:
    """The install a missing device runtime names: the family's runtime wheel (CUDA 12's
    from 12.8, the first with libcudadevrt.a)."""
    from kjit.compiler import nvrtc
    major = nvrtc.version()[0]
    return "pip install nvidia-cuda-runtime" if major >= 13 else \
        f"pip install 'nvidia-cuda-runtime-cu{major}>=12.8'"


def test_missing_device_runtime_says_which_wheel_to_install(monkeypatch):
    monkeypatch.delenv(devrt.ENV_DEVRT, raising=False)
    monkeypatch.setattr(devrt, "candidates", lambda: [])
    with pytest.raises(LinkError) as info:
        link([ptx(DEVICE_LAUNCH, "launch.cu")], arch=ARCH, backend="nvjitlink")
    text = str(info.value)
    assert _devrt_install() in text and "libcudadevrt.a" in text
    assert "launch.ptx" in text


def test_device_runtime_true_without_the_library_says_so(monkeypatch):
    monkeypatch.delenv(devrt.ENV_DEVRT, raising=False)
    monkeypatch.setattr(devrt, "candidates", lambda: [])
    with pytest.raises(LinkError, match=r"device_runtime=True asks for the CUDA device runtime.*"
                                        + re.escape(_devrt_install())):
        link(ptx(LIB, "l.cu"), arch=ARCH, options=LinkOptions(device_runtime=True))


def test_device_runtime_is_found_in_the_wheel_layout(monkeypatch, tmp_path):
    monkeypatch.delenv(devrt.ENV_DEVRT, raising=False)
    for major in ("12", "13"):
        d = tmp_path / "nvidia" / f"cu{major}" / "lib"
        d.mkdir(parents=True)
        (d / "libcudadevrt.a").write_bytes(b"!<arch>\n")
    monkeypatch.setattr(devrt, "_search_dirs", lambda: [tmp_path])
    assert devrt.find(13) == tmp_path / "nvidia" / "cu13" / "lib" / "libcudadevrt.a"
    assert devrt.find(12) == tmp_path / "nvidia" / "cu12" / "lib" / "libcudadevrt.a"
    monkeypatch.setenv(devrt.ENV_DEVRT, str(tmp_path / "missing.a"))
    with pytest.raises(LinkError, match="does not name a file"):
        devrt.find(13)


def test_device_runtime_is_added_automatically():
    lib = _devrt_or_skip()
    res = link([ptx(DEVICE_LAUNCH, "launch.cu")], arch=ARCH, backend="nvjitlink")
    assert res.device_runtime == str(lib)
    assert {"parent", "child"} <= set(res.object.entry_points)
    assert not any("cudaCDP" in s for s in undefined(res.code))


def test_device_runtime_is_added_for_lto_ir_after_the_linker_asks_for_it():
    _devrt_or_skip()
    lto = kjit.compile(DEVICE_LAUNCH, arch=ARCH, target="ltoir", options=RDC)
    res = link([lto], arch=ARCH)
    assert res.device_runtime and "parent" in res.object.entry_points


def test_device_runtime_false_leaves_it_out():
    with pytest.raises(LinkError) as info:
        link([ptx(DEVICE_LAUNCH, "launch.cu")], arch=ARCH, backend="nvjitlink",
             options=LinkOptions(device_runtime=False))
    assert "cudaCDP" in (info.value.symbol or "")


# --- cache ----------------------------------------------------------------------------

def test_linked_results_are_cached_by_inputs_and_options():
    a, b = ptx(LIB, "lib.cu"), ptx(MAIN, "main.cu")
    first = link([a, b], arch=ARCH, backend="nvjitlink")
    again = link([a, b], arch=ARCH, backend="nvjitlink")
    assert first.cache_hit is False and again.cache_hit is True
    assert again.code == first.code and again.backend == "nvjitlink"
    assert again.wall_time_ms == first.wall_time_ms  # the link's own time, kept with the entry
    assert link([a, b], arch=ARCH, backend="nvjitlink",
                options=LinkOptions(max_registers=32)).cache_hit is False
    assert link([b, a], arch=ARCH, backend="nvjitlink").cache_hit is False  # order matters
    assert link([a, b], arch=ARCH, backend="nvjitlink", cache=False).cache_hit is None


def test_the_elf_structure_is_checked_to_link_not_on_a_cache_hit(monkeypatch):
    from kjit.linker import inputs
    a = kjit.compile(LIB, arch=ARCH, options=RDC, name="lib.cu")
    b = kjit.compile(MAIN, arch=ARCH, options=RDC, name="main.cu")
    assert a.kind == b.kind == "object"
    real, checked = inputs.check_structure, []
    monkeypatch.setattr(inputs, "check_structure",
                        lambda code, kind: checked.append(kind) or real(code, kind))
    assert link([a, b], arch=ARCH, backend="nvjitlink").cache_hit is False
    assert checked == ["object", "object"]
    assert link([a, b], arch=ARCH, backend="nvjitlink").cache_hit is True
    assert checked == ["object", "object"]       # a hit runs no linker: nothing to check


def test_cache_off_by_env(monkeypatch):
    monkeypatch.setenv("KJIT_CACHE", "0")
    assert link([ptx(LIB, "l.cu"), ptx(MAIN, "m.cu")], arch=ARCH).cache_hit is None


def test_name_expression_symbols_survive_linking():
    src = r'''template <typename T> __global__ void fill(T* p) { p[threadIdx.x] = T(1); }'''
    obj = kjit.compile(src, arch=ARCH, target="ptx", options=RDC, name_expressions=["fill<int>"])
    res = link([obj], arch=ARCH)
    assert res.object.lowered_name("fill<int>") in res.object.entry_points


# --- ptx_to_cubin ---------------------------------------------------------------------

def test_ptx_to_cubin_needs_no_gpu(saxpy_src):
    p = kjit.compile(saxpy_src, arch="compute_90", target="ptx")
    cub = ptx_to_cubin(p.code, "compute_90")
    assert cub.kind == "cubin" and cub.arch == "sm_90" and cub.entry_points == ("saxpy",)
    assert ElfFile(cub.code).cuda_sm == 90
    assert ptx_to_cubin(p.code, "sm_90").cache_hit is True
    with pytest.raises(InvalidOptionError):
        ptx_to_cubin(p.code, "gfx90a")


# --- backend choice -------------------------------------------------------------------

@pytest.mark.parametrize("driver,ptx", [
    (12000, (8, 0)), (12010, (8, 1)), (12020, (8, 2)), (12030, (8, 3)), (12040, (8, 4)),
    (12050, (8, 5)), (12060, (8, 5)), (12080, (8, 7)), (12090, (8, 8)), (13000, (9, 0)),
    (13050, (9, 5)),
    (13070, (9, 7)), (14000, (10, 0)),  # past the table: PTX ISA M.m ships with CUDA (M+4).m
])
def test_newest_ptx_each_driver_accepts(driver, ptx):
    assert max_ptx_for_driver(driver) == ptx


def test_ptx_version_requirements():
    assert cuda_version_for_ptx((9, 5)) == 13050
    assert ptx_too_new((9, 5), 13000) and not ptx_too_new((9, 0), 13000)
    assert not ptx_too_new((7, 8), 12000)
    assert ptx_too_new((8, 9), 99000)  # not a version any compiler emits: never the driver


def test_auto_chooses_nvjitlink_for_lto_ir_no_gpu_and_new_ptx():
    c = choose_backend("auto", kinds={"ltoir"}, gpu_present=True, driver_version=13000)
    assert c.backend == "nvjitlink" and "LTO-IR" in c.reason
    c = choose_backend("auto", kinds={"ptx"}, lto=True, gpu_present=True, driver_version=13000)
    assert c.backend == "nvjitlink"
    c = choose_backend("auto", kinds={"ptx"}, ptx_versions=[(9, 0)], gpu_present=False,
                       driver_version=None)
    assert c.backend == "nvjitlink" and "no GPU" in c.reason
    c = choose_backend("auto", kinds={"ptx", "cubin"}, ptx_versions=[(9, 0), (9, 5)],
                       gpu_present=True, driver_version=13000)
    assert c.backend == "nvjitlink"
    assert "9.5" in c.reason and "13.0" in c.reason and "9.0" in c.reason


def test_auto_chooses_the_driver_when_it_accepts_everything():
    c = choose_backend("auto", kinds={"ptx", "cubin"}, ptx_versions=[(9, 0)],
                       gpu_present=True, driver_version=13000)
    assert c.backend == "driver"
    c = choose_backend("auto", kinds={"cubin", "fatbin", "library"}, gpu_present=True,
                       driver_version=12040)
    assert c.backend == "driver"
    c = choose_backend("auto", kinds={"ptx"}, ptx_versions=[(8, 4)], gpu_present=True,
                       driver_version=12040)
    assert c.backend == "driver"
    c = choose_backend("auto", kinds={"ptx"}, ptx_versions=[(8, 5)], gpu_present=True,
                       driver_version=12040)
    assert c.backend == "nvjitlink"


def test_auto_routes_cubins_from_a_newer_toolkit_to_nvjitlink():
    c = choose_backend("auto", kinds={"cubin"}, cubin_versions=[13050], gpu_present=True,
                       driver_version=13000)
    assert c.backend == "nvjitlink" and "13.5" in c.reason and "13.0" in c.reason
    c = choose_backend("auto", kinds={"cubin"}, cubin_versions=[13000], gpu_present=True,
                       driver_version=13000)
    assert c.backend == "driver"


def test_the_toolkit_that_built_a_cubin_is_read_from_it():
    from kjit.linker.inputs import normalize
    from kjit.compiler import nvrtc
    major, minor = nvrtc.version()
    cub = kjit.compile(LIB, arch=ARCH, target="cubin", options=RDC)
    # CUDA 13's ptxas names itself in .note.nv.tkinfo; NVRTC 12.9's writes no such note,
    # and then no version is claimed
    noted = ElfFile(cub.code).section(".note.nv.tkinfo") is not None
    assert noted or major < 13
    assert normalize([cub])[0].toolkit_version == (1000 * major + 10 * minor if noted else None)
    assert normalize([ptx(LIB, "l.cu")])[0].toolkit_version is None


def test_auto_other_reasons_for_nvjitlink():
    base = dict(kinds={"ptx"}, ptx_versions=[(9, 0)], gpu_present=True, driver_version=13000)
    assert choose_backend("auto", **base, nvjitlink_only_options=True).backend == "nvjitlink"
    assert choose_backend("auto", **base, arch_specific=True).backend == "nvjitlink"
    assert choose_backend("auto", **base, device_runtime=True).backend == "nvjitlink"


def test_explicit_backends():
    assert choose_backend("nvjitlink", kinds={"ptx"}, gpu_present=True,
                          driver_version=13000).backend == "nvjitlink"
    assert choose_backend("driver", kinds={"ptx"}, ptx_versions=[(9, 5)], gpu_present=True,
                          driver_version=13000).backend == "driver"  # the user's choice stands
    with pytest.raises(InvalidOptionError, match="LTO-IR"):
        choose_backend("driver", kinds={"ltoir"}, gpu_present=True, driver_version=13000)
    with pytest.raises(CudaUnavailableError, match="nvjitlink"):
        choose_backend("driver", kinds={"ptx"}, gpu_present=False, driver_version=None)
    with pytest.raises(InvalidOptionError, match="sm_XYa"):
        choose_backend("driver", kinds={"ptx"}, gpu_present=True, driver_version=13000,
                       arch_specific=True)
    with pytest.raises(InvalidOptionError, match="nvJitLink flags"):
        choose_backend("driver", kinds={"ptx"}, gpu_present=True, driver_version=13000,
                       nvjitlink_only_options=True)
    with pytest.raises(InvalidOptionError):
        choose_backend("gold", kinds={"ptx"}, gpu_present=True, driver_version=13000)


def test_driver_backend_without_a_gpu_is_a_clear_error():
    from kjit import driver
    if driver.available():
        pytest.skip("a GPU is present")
    with pytest.raises(CudaUnavailableError, match="backend='nvjitlink'"):
        link([ptx(LIB, "l.cu")], arch=ARCH, backend="driver")


def test_auto_without_gpu_uses_nvjitlink_and_says_so():
    from kjit import driver
    if driver.available():
        pytest.skip("a GPU is present")
    res = link([ptx(LIB, "l.cu"), ptx(MAIN, "m.cu")], arch=ARCH)
    assert res.backend == "nvjitlink" and res.reason == "no GPU here"


# --- CLI ------------------------------------------------------------------------------

def _cli():
    from kjit.cli.main import cli
    return cli


def test_cli_link_writes_a_cubin_and_reports_json(tmp_path):
    pa = ptx(MOD_A, "a.cu").save(tmp_path / "a.ptx")
    pb = ptx(MOD_B, "b.cu").save(tmp_path / "b.ptx")
    out = tmp_path / "out.cubin"
    r = CliRunner().invoke(_cli(), ["link", str(pa), str(pb), "--arch", ARCH, "-o", str(out),
                                    "--backend", "nvjitlink", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["backend"] == "nvjitlink" and info["entry_points"] == ["bounce"]
    assert info["output"] == str(out) and info["size"] == out.stat().st_size
    assert kjit.ObjectCode.from_file(out).entry_points == ("bounce",)


def test_cli_link_text_output_and_options(tmp_path, monkeypatch):
    la = kjit.compile(LIB, arch=ARCH, target="ltoir", options=RDC).save(tmp_path / "lib.ltoir")
    lb = kjit.compile(MAIN, arch=ARCH, target="ltoir", options=RDC).save(tmp_path / "main.ltoir")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(_cli(), ["link", str(la), str(lb), "--arch", ARCH, "--lto", "-v",
                                    "-O", "3", "--max-registers", "64"])
    assert r.exit_code == 0, r.output
    assert re.search(r"wrote linked\.cubin \(cubin, sm_90, \d+ bytes\) with nvjitlink", r.output)
    assert "kernels: doubler" in r.output
    assert (tmp_path / "linked.cubin").exists()


def test_cli_link_error_is_a_message_not_a_traceback(tmp_path):
    pm = ptx(MAIN, "main.cu").save(tmp_path / "main.ptx")
    r = CliRunner().invoke(_cli(), ["link", str(pm), "--arch", ARCH, "-o", str(tmp_path / "x.cubin")])
    assert r.exit_code == 1
    assert "undefined symbol" in r.output and "twice" in r.output
    assert "Traceback" not in r.output


def test_cli_link_refuses_to_overwrite_an_input(tmp_path):
    pm = ptx(LIB, "lib.cu").save(tmp_path / "lib.ptx")
    r = CliRunner().invoke(_cli(), ["link", str(pm), "--arch", ARCH, "-o", str(pm)])
    assert r.exit_code != 0 and "one of the inputs" in r.output
