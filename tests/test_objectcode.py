"""ObjectCode: kind sniffing, immutability, files and sidecars, entry points, arch from bytes."""
from __future__ import annotations

import json
import struct

import pytest

import kjit
from kjit.formats.elf import EM_AMDGPU, ElfFile
from kjit.errors import InvalidOptionError, KjitError
from kjit.formats.sniff import sniff_kind
from kjit.objectcode import SIDECAR_SUFFIX, ObjectCode

from conftest import SAXPY, TEMPLATE

TWO_KERNELS = r'''
__device__ __noinline__ float helper(float v) { return v * 2.0f; }
extern "C" __global__ void first(float* x) { x[0] = helper(x[0]); }
extern "C" __global__ void second(float* x) { x[1] = helper(x[1]); }
'''


@pytest.fixture(scope="module")
def cubin() -> bytes:
    return kjit.compile(SAXPY, arch="sm_90", cache=False).code


@pytest.fixture(scope="module")
def ptx() -> bytes:
    return kjit.compile(SAXPY, arch="sm_90", target="ptx", cache=False).code


@pytest.fixture(scope="module")
def ltoir() -> bytes:
    return kjit.compile(SAXPY, arch="sm_90", target="ltoir", cache=False).code


@pytest.fixture(scope="module")
def rdc_cubin() -> bytes:
    return kjit.compile(SAXPY, arch="sm_90", cache=False,
                        options=kjit.CompileOptions(relocatable=True)).code


def fatbin_of(cubin: bytes) -> bytes:
    """A real fatbin made by nvFatbin around one cubin."""
    from cuda.bindings import nvfatbin
    handle = nvfatbin.create([], 0)
    try:
        nvfatbin.add_cubin(handle, cubin, len(cubin), "90", "saxpy")
        buf = bytearray(nvfatbin.size(handle))
        nvfatbin.get(handle, buf)
    finally:
        nvfatbin.destroy(handle)
    return bytes(buf)


def patched(code: bytes, offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(code)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


# --- kind sniffing -------------------------------------------------------------------

def test_sniff_compiled_kinds(cubin, ptx, ltoir, rdc_cubin):
    assert sniff_kind(cubin) == "cubin"
    assert sniff_kind(rdc_cubin) == "object"
    assert sniff_kind(ptx) == "ptx"
    assert sniff_kind(ltoir) == "ltoir"


def test_sniff_fatbin(cubin):
    fat = fatbin_of(cubin)
    assert struct.unpack_from("<I", fat)[0] == 0xBA55ED50
    assert sniff_kind(fat) == "fatbin"
    assert sniff_kind(b"\x50\xed\x55\xba" + bytes(60)) == "fatbin"  # the magic alone decides


def test_sniff_amd_code_object(cubin):
    amd = patched(cubin, 18, "<H", EM_AMDGPU)  # e_machine
    assert sniff_kind(amd) == "hsaco"


def test_sniff_offload_bundle_and_archive():
    assert sniff_kind(b"__CLANG_OFFLOAD_BUNDLE__" + bytes(40)) == "hipfb"
    assert sniff_kind(b"!<arch>\n/               0           0     0     0       4         `\n") \
        == "library"


@pytest.mark.parametrize("junk", [b"", b"garbage", bytes(200), b"MZ\x90\x00" + bytes(100),
                                  b"// just a comment\n"])
def test_sniff_garbage_is_a_clear_error(junk):
    with pytest.raises(InvalidOptionError, match="unrecognised binary: not PTX, cubin, fatbin"):
        sniff_kind(junk)


def test_sniff_foreign_and_truncated_elf(cubin):
    with pytest.raises(InvalidOptionError, match="machine 62 is neither CUDA nor AMDGPU"):
        sniff_kind(patched(cubin, 18, "<H", 62))  # an x86-64 ELF
    with pytest.raises(InvalidOptionError, match="corrupt ELF"):
        sniff_kind(cubin[:200])


def test_constructor_sniffs_and_checks_the_claimed_kind(cubin, ptx, rdc_cubin):
    assert ObjectCode(cubin).kind == "cubin"
    assert ObjectCode(ptx.decode()).kind == "ptx"  # PTX may be given as text
    assert ObjectCode(bytearray(ptx)).code == ptx
    # a relocatable cubin is an object whatever it is called, so it saves and loads the same
    assert ObjectCode(rdc_cubin, kind="cubin").kind == "object"
    assert ObjectCode(cubin, kind="object").kind == "cubin"
    with pytest.raises(InvalidOptionError, match="kind='cubin' but the bytes are 'ptx'"):
        ObjectCode(ptx, kind="cubin")
    with pytest.raises(InvalidOptionError, match="kind='hsaco'"):
        ObjectCode(cubin, kind="hsaco")
    with pytest.raises(InvalidOptionError, match="not a valid ELF"):
        ObjectCode(b"garbage", kind="cubin")
    with pytest.raises(InvalidOptionError, match="unknown ObjectCode kind 'exe'"):
        ObjectCode(cubin, kind="exe")
    with pytest.raises(InvalidOptionError, match="must be bytes"):
        ObjectCode(12345)  # type: ignore[arg-type]


# --- a value ---------------------------------------------------------------------------

def test_immutable(cubin):
    symbols = {"axpy<float>": "_Z4axpy"}
    obj = ObjectCode(cubin, symbols=symbols, metadata={"k": 1})
    with pytest.raises(AttributeError):
        obj.code = b""  # type: ignore[misc]
    with pytest.raises(AttributeError):
        obj.arch = "sm_80"  # type: ignore[misc]
    with pytest.raises(TypeError):
        obj.symbols["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        obj.metadata["k"] = 2  # type: ignore[index]
    symbols["later"] = "change"  # the caller's dict is copied, not shared
    assert "later" not in obj.symbols


def test_bytearray_input_is_copied(ptx):
    buf = bytearray(ptx)
    obj = ObjectCode(buf)
    buf[:2] = b"XX"
    assert obj.code == ptx and isinstance(obj.code, bytes)


def test_with_returns_a_changed_copy(cubin):
    obj = ObjectCode(cubin)
    hit = obj.with_(cache_hit=True)
    assert hit.cache_hit is True and obj.cache_hit is None
    assert hit == obj  # cache_hit is not part of the value


def test_equality_and_hash(cubin, ptx):
    a, b = ObjectCode(cubin), ObjectCode(bytes(cubin))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert ObjectCode(cubin) != ObjectCode(ptx)
    assert ObjectCode(cubin, arch="sm_90a") != a
    assert ObjectCode(cubin, symbols={"f": "g"}) != a


def test_repr_is_short(cubin):
    text = repr(ObjectCode(cubin))
    assert "cubin" in text and "sm_90" in text and f"{len(cubin)} bytes" in text and len(text) < 120


# --- arch from the bytes ---------------------------------------------------------------

def test_arch_from_cubin_e_flags(cubin):
    assert ObjectCode(cubin).arch == "sm_90"
    assert ObjectCode(kjit.compile(SAXPY, arch="sm_80", cache=False).code).arch == "sm_80"
    elf = ElfFile(cubin)
    if elf.abiversion >= 8:   # CUDA 13's ELF ABI: the SM number sits in bits 8..15
        flags = (elf.flags & ~0xFF00) | (120 << 8)
    else:                     # ABI 7 (NVRTC 12's cubins): in bits 0..7 and 16..23
        assert elf.abiversion == 7 and elf.flags & 0xFF == 90
        flags = (elf.flags & ~0xFF00FF) | (120 << 16) | 120
    assert ObjectCode(patched(cubin, 48, "<I", flags)).arch == "sm_120"


def test_arch_from_pre_12_8_cubin_e_flags(cubin):
    old = patched(cubin, 8, "<B", 7)             # EI_ABIVERSION 7
    old = patched(old, 48, "<I", 0x00500550)     # an sm_80 cubin's e_flags before ABI 8
    assert ObjectCode(old).arch == "sm_80"


def test_arch_from_ptx_target(ptx):
    assert ObjectCode(ptx).arch == "compute_90"
    assert ObjectCode(ptx).ptx_version == tuple(
        int(v) for v in ptx.split(b".version ", 1)[1].split(b"\n", 1)[0].split(b"."))


def test_explicit_arch_is_kept(ltoir):
    assert ObjectCode(ltoir).arch is None  # LTO-IR does not say
    assert ObjectCode(ltoir, arch="sm_90").arch == "sm_90"


# --- entry points ----------------------------------------------------------------------

def test_entry_points_from_elf_symbols_exclude_device_functions():
    obj = kjit.compile(TWO_KERNELS, arch="sm_90", cache=False,
                       options=kjit.CompileOptions(relocatable=True))
    functions = {s.name for s in ElfFile(obj.code).symbols if s.type == 2}  # STT_FUNC
    assert functions == {"first", "second", "_Z6helperf"}
    assert obj.entry_points == ("first", "second")


def test_entry_points_from_ptx():
    obj = kjit.compile(TWO_KERNELS, arch="sm_90", target="ptx", cache=False)
    assert set(obj.entry_points) == {"first", "second"}
    text = ".version 8.0\n.target sm_80\n.address_size 64\n" \
           ".visible .entry alpha(\n)\n{\n}\n.entry beta()\n{\n}\n.func gamma()\n{\n}\n"
    assert ObjectCode(text).entry_points == ("alpha", "beta")


def test_entry_points_of_templates_are_mangled():
    obj = kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["axpy<float>"], cache=False)
    assert obj.entry_points == ("_Z4axpyIfEvT_PKS0_PS0_i",)


def test_entry_points_of_kinds_without_a_symbol_table(ltoir):
    assert ObjectCode(ltoir).entry_points == ()


def test_entry_points_of_a_fatbin(cubin):
    pytest.importorskip("kjit.formats.fatbin")
    assert ObjectCode(fatbin_of(cubin)).entry_points == ("saxpy",)


# --- files -----------------------------------------------------------------------------

def test_save_and_load_cubin(tmp_path, cubin):
    obj = ObjectCode(cubin, name="saxpy.cu")
    path = obj.save(tmp_path / "saxpy.cubin")
    assert path.read_bytes() == cubin
    assert not (tmp_path / ("saxpy.cubin" + SIDECAR_SUFFIX)).exists()  # nothing the bytes lack
    back = ObjectCode.from_file(path)
    assert back == obj and back.kind == "cubin" and back.entry_points == ("saxpy",)
    assert [p.name for p in tmp_path.iterdir()] == ["saxpy.cubin"]  # no temporary left


def test_save_and_load_keeps_symbols_in_a_sidecar(tmp_path):
    obj = kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["axpy<float>", "axpy<double>"])
    path = obj.save(tmp_path / "axpy.cubin")
    side = json.loads((tmp_path / ("axpy.cubin" + SIDECAR_SUFFIX)).read_text())
    assert side["symbols"] == dict(obj.symbols)
    back = ObjectCode.from_file(path)
    assert back == obj and back.symbols["axpy<float>"] == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert back.lowered_name("axpy<double>") == "_Z4axpyIdEvT_PKS0_PS0_i"


def test_save_and_load_keeps_an_arch_the_bytes_do_not_record(tmp_path, ltoir):
    for code, arch, name in [(ltoir, "sm_90", "k.ltoir"),
                             (kjit.compile(SAXPY, arch="sm_90a").code, "sm_90a", "k.cubin")]:
        ObjectCode(code, arch=arch).save(tmp_path / name)
        assert ObjectCode.from_file(tmp_path / name).arch == arch


def test_saved_ptx_needs_no_sidecar_for_its_arch(tmp_path):
    # the bytes only: a PTX compiled from source also has declarations, which need one
    obj = ObjectCode(kjit.compile(SAXPY, arch="sm_90", target="ptx").code, arch="sm_90")
    obj.save(tmp_path / "k.ptx")
    assert [p.name for p in tmp_path.iterdir()] == ["k.ptx"]
    back = ObjectCode.from_file(tmp_path / "k.ptx")
    assert back.code == obj.code and back.kind == "ptx" and back.arch == "compute_90"


def test_relocatable_object_round_trip(tmp_path, rdc_cubin):
    obj = ObjectCode(rdc_cubin, kind="cubin")
    assert ObjectCode.from_file(obj.save(tmp_path / "k.cubin")) == obj


def test_resaving_without_symbols_removes_the_sidecar(tmp_path, cubin):
    path = tmp_path / "k.cubin"
    ObjectCode(cubin, symbols={"a": "b"}).save(path)
    assert (tmp_path / ("k.cubin" + SIDECAR_SUFFIX)).exists()
    ObjectCode(cubin).save(path)
    assert not (tmp_path / ("k.cubin" + SIDECAR_SUFFIX)).exists()


def test_a_stale_sidecar_is_ignored(tmp_path):
    path = tmp_path / "k.cubin"
    kjit.compile(TEMPLATE, arch="sm_90", name_expressions=["axpy<float>"]).save(path)
    other = kjit.compile(SAXPY, arch="sm_80").code
    path.write_bytes(other)  # replaced by another tool; the sidecar stays behind
    back = ObjectCode.from_file(path)
    assert back.arch == "sm_80" and dict(back.symbols) == {}


def test_from_file_errors(tmp_path):
    with pytest.raises(InvalidOptionError, match="no such file"):
        ObjectCode.from_file(tmp_path / "missing.cubin")
    with pytest.raises(KjitError, match="cannot read"):
        ObjectCode.from_file(tmp_path)
    (tmp_path / "junk.bin").write_bytes(b"junk")
    with pytest.raises(InvalidOptionError, match="unrecognised binary"):
        ObjectCode.from_file(tmp_path / "junk.bin")


def test_from_file_with_explicit_kind(tmp_path, ptx):
    (tmp_path / "k.txt").write_bytes(ptx)
    assert ObjectCode.from_file(tmp_path / "k.txt", kind="ptx").kind == "ptx"
