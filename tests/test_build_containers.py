"""kjit.formats.fatbin (the nvFatbin writer and the container reader) and kjit.build.pack:
entries, arch names, compression, determinism, truncation, and the driver's choice of entry."""
from __future__ import annotations

import glob
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kjit.compiler.cached import compile as kjit_compile
from kjit.formats.fatbin import (ContainerFormatError, Entry, FatbinInput, best_entry, entries,
                                 read_fatbin, runs_on, write_fatbin)
from kjit.errors import InvalidOptionError, KjitError
from kjit.build.pack import make_fatbin
from kjit.objectcode import ObjectCode

SRC = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    __shared__ float tile[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = a * tile[threadIdx.x] + y[i];
}
extern "C" __global__ void fill(int* p, int v) { p[threadIdx.x] = v; }
'''


def cuobjdump_path() -> str | None:
    """cuobjdump from PATH, the CUDA toolkit, or the nvidia-cuda-cuobjdump wheel."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import nvidia  # namespace package of NVIDIA's wheels
        for base in nvidia.__path__:
            for cand in sorted(Path(base).glob("cu*/bin/cuobjdump")):
                return str(cand)
    except ImportError:
        pass
    found = sorted(glob.glob("/usr/local/cuda*/bin/cuobjdump"))
    return found[0] if found else None


CUOBJDUMP = cuobjdump_path()
needs_cuobjdump = pytest.mark.skipif(
    CUOBJDUMP is None, reason="cuobjdump not installed (nvcc's tools or pip install "
                              "nvidia-cuda-cuobjdump); the fatbin headers are checked by kjit's reader")


@pytest.fixture(scope="module")
def objs() -> dict[str, ObjectCode]:
    out = {a: kjit_compile(SRC, arch=a, name="lib.cu", cache=False)
           for a in ("sm_80", "sm_90", "sm_100")}
    out["compute_90"] = kjit_compile(SRC, arch="compute_90", target="ptx", name="lib.cu", cache=False)
    return out


def test_three_archs_plus_ptx_are_all_in_the_headers(objs):
    fat = make_fatbin(objs.values())
    assert fat.kind == "fatbin" and fat.code[:4] == b"\x50\xed\x55\xba"
    got = [(e.kind, e.arch) for e in entries(fat.code, "fatbin")]
    assert got == [("cubin", "sm_80"), ("cubin", "sm_90"), ("cubin", "sm_100"),
                   ("ptx", "compute_90")]
    by_arch = {e.arch: e for e in read_fatbin(fat.code)}
    for a in ("sm_80", "sm_90", "sm_100"):
        assert by_arch[a].code == objs[a].code, "a cubin must come back byte for byte"
        assert by_arch[a].name == "lib.cu" and not by_arch[a].compressed
    ptx = by_arch["compute_90"]
    assert ptx.ptx_version == (9, 5) or ptx.ptx_version == objs["compute_90"].ptx_version
    assert b".entry saxpy" in ptx.code and b".entry fill" in ptx.code
    assert set(fat.entry_points) == {"saxpy", "fill"}


@needs_cuobjdump
def test_cuobjdump_lists_the_same_entries(objs, tmp_path):
    path = tmp_path / "lib.fatbin"
    path.write_bytes(make_fatbin(objs.values()).code)
    out = subprocess.run([CUOBJDUMP, "--list-elf", "--list-ptx", str(path)],
                         capture_output=True, text=True, check=True).stdout
    elf = re.findall(r"ELF file\s+\d+: \S*\.(sm_\d+\w?)\.cubin", out)
    ptx = re.findall(r"PTX file\s+\d+: \S*\.(sm_\d+\w?)\.ptx", out)
    assert sorted(elf) == ["sm_100", "sm_80", "sm_90"], out
    assert ptx == ["sm_90"], out
    mine = entries(path.read_bytes())
    assert sorted(e.arch for e in mine if e.kind == "cubin") == sorted(elf)
    assert [e.arch.replace("compute_", "sm_") for e in mine if e.kind == "ptx"] == ptx


def test_same_inputs_give_identical_bytes_in_any_order(objs):
    items = list(objs.values())
    first = write_fatbin(items)
    assert write_fatbin(items) == first
    assert write_fatbin(list(reversed(items))) == first


def test_arch_specific_and_family_entries_keep_their_suffix():
    items = [kjit_compile(SRC, arch="sm_90a", cache=False),
             kjit_compile(SRC, arch="sm_100f", cache=False),
             kjit_compile(SRC, arch="compute_100f", target="ptx", cache=False)]
    got = {(e.kind, e.arch) for e in entries(write_fatbin(items), "fatbin")}
    assert got == {("cubin", "sm_90a"), ("cubin", "sm_100f"), ("ptx", "compute_100f")}


def test_lz4_compressed_entries_are_decoded(objs):
    code = write_fatbin(objs.values(), compress="speed")
    assert len(code) < len(write_fatbin(objs.values()))
    es = {e.arch: e for e in entries(code, "fatbin")}
    assert es["compute_90"].compression == "lz4" and es["compute_90"].decoded
    assert b".entry saxpy" in es["compute_90"].code
    assert es["compute_90"].stored_size < es["compute_90"].size


def test_zstd_compressed_entries_decode_when_a_zstd_library_exists(objs):
    code = write_fatbin(objs.values(), compress="size")
    es = {e.arch: e for e in entries(code, "fatbin")}
    assert all(e.compression == "zstd" for e in es.values())
    try:
        import zstandard  # noqa: F401
        have_zstd = True
    except ImportError:
        have_zstd = False
    if have_zstd:
        assert es["sm_90"].decoded and es["sm_90"].code == objs["sm_90"].code
        assert set(ObjectCode(code, kind="fatbin").entry_points) == {"saxpy", "fill"}
    else:
        assert not es["sm_90"].decoded and "zstandard" in es["sm_90"].note


@pytest.mark.parametrize("cut", [3, 20, 100, -1000, -1])
def test_truncated_fatbin_names_the_problem(objs, cut):
    code = write_fatbin(objs.values())
    with pytest.raises(ContainerFormatError, match="truncated") as info:
        read_fatbin(code[:cut])
    assert isinstance(info.value, KjitError)


def test_not_a_fatbin_is_a_clear_error():
    with pytest.raises(ContainerFormatError, match="magic"):
        read_fatbin(b"\x00" * 8 + b"garbage" * 10)


def test_plain_kinds_are_their_own_single_entry(objs):
    [cubin] = entries(objs["sm_90"].code)
    assert (cubin.kind, cubin.arch, cubin.code) == ("cubin", "sm_90", objs["sm_90"].code)
    [ptx] = entries(objs["compute_90"].code, "ptx")
    assert ptx.kind == "ptx" and ptx.arch == "compute_90" and ptx.ptx_version is not None


def test_hipfb_is_read_by_the_hip_bundle_module(monkeypatch):
    import kjit.formats.bundle as bundle
    seen = []

    def fake_read(code):
        seen.append(code)
        return [bundle.Entry("hsaco", "gfx90a", b"\x7fELF-ish", "hipv4-amdgcn-amd-amdhsa--gfx90a")]

    monkeypatch.setattr(bundle, "read_bundle", fake_read)
    [e] = entries(b"__CLANG_OFFLOAD_BUNDLE__xyz", "hipfb")
    assert seen == [b"__CLANG_OFFLOAD_BUNDLE__xyz"]
    assert isinstance(e, Entry) and (e.kind, e.arch) == ("hsaco", "gfx90a")
    assert e.name == "hipv4-amdgcn-amd-amdhsa--gfx90a"


def test_bad_inputs_are_refused_before_nvfatbin(objs):
    with pytest.raises(InvalidOptionError, match="compress"):
        write_fatbin(objs.values(), compress="max")
    with pytest.raises(InvalidOptionError, match="at least one"):
        write_fatbin([])
    with pytest.raises(InvalidOptionError, match="two cubin entries for sm_90"):
        write_fatbin([objs["sm_90"], FatbinInput("cubin", "sm_90", objs["sm_90"].code, "other.cu")])
    with pytest.raises(InvalidOptionError, match="offload bundle"):
        write_fatbin([FatbinInput("hsaco", "sm_90", b"x")])


def test_name_expression_symbols_are_merged():
    tmpl = "template <typename T> __global__ void k(T* p) { p[0] = T(1); }"
    a = kjit_compile(tmpl, arch="sm_80", name_expressions=["k<float>"], cache=False)
    b = kjit_compile(tmpl, arch="sm_90", name_expressions=["k<float>"], cache=False)
    fat = make_fatbin([a, b])
    assert dict(fat.symbols) == {"k<float>": a.symbols["k<float>"]}


@pytest.mark.parametrize("entry_arch, device, ok", [
    ("sm_80", "sm_86", True), ("sm_86", "sm_80", False), ("sm_80", "sm_90", False),
    ("compute_80", "sm_90", True), ("compute_90", "sm_80", False),
    ("sm_90a", "sm_90", True), ("compute_90a", "sm_100", False),
    ("sm_100f", "sm_103", True), ("sm_100f", "sm_120", False),
])
def test_runs_on_follows_the_driver_rules(entry_arch, device, ok):
    assert runs_on(entry_arch, device) is ok


def test_best_entry_prefers_the_closest_cubin_then_ptx(objs):
    es = entries(write_fatbin(objs.values()))
    pick = lambda d: (lambda e: e and (e.kind, e.arch))(best_entry(es, d))  # noqa: E731
    assert pick("sm_86") == ("cubin", "sm_80")
    assert pick("sm_90") == ("cubin", "sm_90")
    assert pick("sm_103") == ("cubin", "sm_100")
    assert pick("sm_120") == ("ptx", "compute_90")
    assert pick("sm_75") is None
