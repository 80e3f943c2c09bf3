"""Clang offload bundles of real hiprtc code objects: written, read back, listed."""
from __future__ import annotations

import struct

import pytest

import kjit
from kjit.compiler import hiprtc
from kjit.compiler.options import CompileOptions
from kjit.errors import InvalidOptionError
from kjit.formats import bundle
from kjit.formats.sniff import sniff_kind

pytestmark = [
    pytest.mark.hip,
    pytest.mark.skipif(not hiprtc.available(),
                       reason="hiprtc not installed: apt-get install libamdhip64-5 libhiprtc-builtins5"),
]

SRC = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void scale(float* y, float s) { y[threadIdx.x] *= s; }
'''


def code_object(arch: str) -> bytes:
    code, *_ = hiprtc.compile_source(SRC, name="k.hip", arch=arch, options=CompileOptions())
    return code


@pytest.fixture(scope="module")
def objects() -> dict[str, bytes]:
    return {a: code_object(a) for a in ("gfx90a", "gfx908", "gfx1030")}


def _raw_table(data: bytes) -> list[tuple[int, int, str]]:
    """The entry table decoded independently of kjit.hip.bundle: (offset, size, id)."""
    assert data[:24] == b"__CLANG_OFFLOAD_BUNDLE__"
    (count,) = struct.unpack_from("<Q", data, 24)
    pos, out = 32, []
    for _ in range(count):
        off, size, n = struct.unpack_from("<QQQ", data, pos)
        out.append((off, size, data[pos + 24:pos + 24 + n].decode()))
        pos += 24 + n
    return out


def test_bundle_layout_is_the_clang_offload_bundler_format(objects):
    data = bundle.write_bundle([(a, c) for a, c in objects.items()])
    assert sniff_kind(data) == "hipfb"
    table = _raw_table(data)
    assert [t[2] for t in table] == [
        "host-x86_64-unknown-linux--",
        "hipv4-amdgcn-amd-amdhsa--gfx90a",
        "hipv4-amdgcn-amd-amdhsa--gfx908",
        "hipv4-amdgcn-amd-amdhsa--gfx1030"]
    assert table[0][1] == 0  # the host entry is empty, as in hipcc's bundles
    for (off, size, eid), arch in zip(table[1:], objects):
        assert off % 4096 == 0
        assert data[off:off + size] == objects[arch]


def test_bundle_reads_back_entry_by_entry(objects):
    data = bundle.write_bundle(list(objects.items()))
    entries = bundle.read_bundle(data)
    assert [(e.kind, e.arch) for e in entries] == [
        ("host", "x86_64-unknown-linux"), ("hsaco", "gfx90a"), ("hsaco", "gfx908"),
        ("hsaco", "gfx1030")]
    assert {e.arch: e.code for e in entries if e.kind == "hsaco"} == objects


def test_bundle_as_object_code_lists_its_kernels_and_entries(objects):
    obj = kjit.ObjectCode(bundle.write_bundle(list(objects.items())))
    assert obj.kind == "hipfb"
    assert set(obj.entry_points) == {"saxpy", "scale"}
    from kjit.formats import fatbin as containers
    listed = [(e.kind, e.arch) for e in containers.entries(obj.code, "hipfb")]
    assert ("hsaco", "gfx908") in listed and ("hsaco", "gfx1030") in listed


def test_target_features_are_part_of_the_entry_id():
    data = bundle.write_bundle([("gfx90a:xnack-", code_object("gfx90a:xnack-")),
                                ("gfx90a:xnack+", code_object("gfx90a:xnack+"))])
    ids = [t[2] for t in _raw_table(data)]
    assert "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-" in ids
    assert "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+" in ids
    assert [e.arch for e in bundle.read_bundle(data)][1:] == ["gfx90a:xnack-", "gfx90a:xnack+"]


def test_entry_id_comes_from_the_code_object_not_the_label():
    # compiled with xnack off but labelled with the bare processor: the entry must still
    # say xnack-, or the runtime would load it on an xnack-on device.
    data = bundle.write_bundle([("gfx90a", code_object("gfx90a:xnack-"))])
    assert _raw_table(data)[1][2] == "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"


def test_target_id_decodes_the_elf_header(objects):
    assert bundle.target_id(objects["gfx90a"]) == "gfx90a"
    assert bundle.target_id(objects["gfx1030"]) == "gfx1030"
    assert bundle.target_id(code_object("gfx908:sramecc+:xnack-")) == "gfx908:sramecc+:xnack-"


def test_mislabelled_code_object_is_refused(objects):
    with pytest.raises(InvalidOptionError, match="holds a code object for gfx908"):
        bundle.write_bundle([("gfx90a", objects["gfx908"])])
    with pytest.raises(InvalidOptionError, match="compiled as gfx90a"):
        bundle.write_bundle([("gfx90a:xnack+", objects["gfx90a"])])


def test_two_objects_for_one_target_are_refused(objects):
    with pytest.raises(InvalidOptionError, match="two code objects for gfx90a"):
        bundle.write_bundle([("gfx90a", objects["gfx90a"]), ("gfx90a", objects["gfx90a"])])


def test_non_amd_code_is_refused(saxpy_src):
    cubin = kjit.compile(saxpy_src, arch="sm_90").code
    with pytest.raises(InvalidOptionError, match="not an AMD code object"):
        bundle.write_bundle([("gfx90a", cubin)])
    with pytest.raises(InvalidOptionError, match="at least one"):
        bundle.write_bundle([])


def test_corrupt_and_foreign_bundles_give_clear_errors(objects):
    data = bundle.write_bundle([("gfx90a", objects["gfx90a"])])
    with pytest.raises(InvalidOptionError, match="corrupt offload bundle"):
        bundle.read_bundle(data[:-100])
    with pytest.raises(InvalidOptionError, match="corrupt offload bundle"):
        bundle.read_bundle(data[:40])
    with pytest.raises(InvalidOptionError, match="compressed offload bundle"):
        bundle.read_bundle(b"CCOB" + b"\0" * 60)
    with pytest.raises(InvalidOptionError, match="not a clang offload bundle"):
        bundle.read_bundle(objects["gfx90a"])


def test_bundles_are_reproducible(objects):
    items = list(objects.items())
    assert bundle.write_bundle(items) == bundle.write_bundle(items)


def test_kjit_build_and_inspect_a_hip_bundle(tmp_path):
    from click.testing import CliRunner
    from kjit.cli.main import cli
    src = tmp_path / "k.hip"
    src.write_text(SRC)
    out = tmp_path / "k.hipfb"
    runner = CliRunner()
    res = runner.invoke(cli, ["build", str(src), "--backend", "hip", "--arch",
                               "gfx90a,gfx908", "-o", str(out)])
    assert res.exit_code == 0, res.output
    archs = [e.arch for e in bundle.read_bundle(out.read_bytes()) if e.kind == "hsaco"]
    assert sorted(archs) == ["gfx908", "gfx90a"]
    res = runner.invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 0, res.output
    assert "gfx90a" in res.output and "gfx908" in res.output and "saxpy" in res.output
