"""Every parser of bytes kjit did not make (issue 16): fatbins, ELF (cubins, AMD code
objects, .nv.info), LZ4 blocks, HIP offload bundles, cache entries, cache export zips,
sidecars and the sniffing of PTX and other kinds.

Property tests (hypothesis): random bytes, and valid inputs with random mutations
(flipped bytes, header fields set to boundary values, cuts, insertions), give a result or
kjit's own error, never another exception, within bounded time and memory. Then the two
crafted bombs of defect 4: an LZ4 entry that declares 64 bytes and would decode to 510 MB,
and an export zip that would inflate to 800 MB.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kjit.formats.fatbin import write_fatbin as build_fatbin
from kjit.cache import entry as entry_mod
from kjit.compiler.cached import compile as kjit_compile
from kjit.errors import KjitError
from kjit.formats import bundle, lz4
from kjit.formats import fatbin as containers
from kjit.formats.elf import ElfFile
from kjit.formats.nvinfo import kernel_resources
from kjit.formats.sniff import ptx_version, sniff_kind
from kjit.objectcode import ObjectCode

SRC = r'''
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    __shared__ float tile[128];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x % 128] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = a * tile[threadIdx.x % 128] + y[i];
}
'''
MAX_SECONDS = 2.0
# KJIT_FUZZ_EXAMPLES=20000 for a deeper run by hand; CI's 200 keep the file to seconds.
EXAMPLES = int(os.environ.get("KJIT_FUZZ_EXAMPLES", "200"))
PROPS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def bounded(fn, data: bytes, *allowed: type[BaseException]):
    """fn(data)'s result, or None when it raised kjit's own error (KjitError or one of
    `allowed`); fails on any other exception, on more than MAX_SECONDS, or on a memory
    peak beyond what the input can justify (LZ4 expands at most 255x)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        return fn(data)
    except (KjitError, *allowed):
        return None
    finally:
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert seconds < MAX_SECONDS, f"{seconds:.2f} s on {len(data)} bytes"
        assert peak < 300 * len(data) + (16 << 20), f"{peak} bytes of memory for {len(data)} bytes"


_BOUNDARY = [0, 1, 0x7F, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, (1 << 64) - 1]


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """`seed` with a few random edits; header fields are where parsers trust numbers."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "field", "cut", "insert", "zero"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "field" and len(data) >= 8:
            width = draw(st.sampled_from([2, 4, 8]))
            at = min(at, len(data) - width)
            value = draw(st.sampled_from(_BOUNDARY + [len(seed), len(seed) + 1, at]))
            data[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        elif op == "cut":
            data = data[:at]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif op == "zero" and data:
            end = min(len(data), at + draw(st.integers(1, 256)))
            data[at:end] = bytes(end - at)
    return bytes(data)


# --- seeds: real bytes made here --------------------------------------------------------------
@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    cubin = kjit_compile(SRC, arch="sm_90", cache=False)
    ptx = kjit_compile(SRC, arch="compute_90", target="ptx", cache=False)
    return {"cubin": cubin.code, "ptx": ptx.code,
            "fatbin": build_fatbin([cubin, ptx]),
            "fatbin_lz4": build_fatbin([cubin, ptx], compress="speed"),
            "fatbin_zstd": build_fatbin([cubin, ptx], compress="size"),
            "bundle": bundle.write_bundle([("gfx90a", _amd_code_object())])}


def _amd_code_object() -> bytes:
    """A real hiprtc code object where hiprtc is installed, else a bare AMDGPU ELF header."""
    try:
        from kjit.compiler import hiprtc
        from kjit.compiler.options import CompileOptions
        if hiprtc.available():
            return hiprtc.compile_source('extern "C" __global__ void k(float* y) { y[0] = 1; }',
                                         name="k.hip", arch="gfx90a", options=CompileOptions())[0]
    except Exception:
        pass
    ident = b"\x7fELF" + bytes([2, 1, 1, 64, 2]) + bytes(7)
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, 0, 0x3F, 64, 56, 0, 64, 0, 0)


# --- parsers ------------------------------------------------------------------------------------
def parse_fatbin(data: bytes):
    out = containers.read_fatbin(data)
    for e in out:
        e.describe()
    return out


def parse_elf(data: bytes):
    elf = ElfFile(data)
    return (elf.sections, elf.symbols, elf.cuda_kernels(), elf.amd_kernels(), elf.cuda_sm,
            [elf.section_bytes(s) for s in elf.sections])


def parse_any(data: bytes):
    """What `kjit inspect` and `kjit link` do first with a file: sniff, then read entries."""
    obj = ObjectCode(data)
    return obj.kind, obj.arch, obj.entry_points, containers.entries(obj.code, obj.kind)


def parse_bundle(data: bytes):
    return [(e.kind, e.arch, len(e.code)) for e in bundle.read_bundle(data)]


@PROPS
@given(st.binary(max_size=4096))
def test_random_bytes_are_read_or_refused(data):
    for fn in (parse_fatbin, parse_elf, parse_any, parse_bundle, kernel_resources, sniff_kind,
               ptx_version):
        bounded(fn, data)
    bounded(lambda d: entry_mod.decode(d, None), data, entry_mod.CorruptEntry)


@pytest.mark.parametrize("kind", ["fatbin", "fatbin_lz4", "fatbin_zstd"])
def test_mutated_fatbins(seeds, kind):
    @PROPS
    @given(mutated(seeds[kind]))
    def check(data):
        bounded(parse_fatbin, data)
        bounded(parse_any, data)
    check()


def test_mutated_cubins(seeds):
    @PROPS
    @given(mutated(seeds["cubin"]))
    def check(data):
        bounded(parse_elf, data)
        bounded(kernel_resources, data)
        bounded(parse_any, data)
    check()


def test_mutated_bundles(seeds):
    @PROPS
    @given(mutated(seeds["bundle"]))
    def check(data):
        bounded(parse_bundle, data)
        bounded(parse_any, data)
    check()


def test_mutated_ptx_headers(seeds):
    head = seeds["ptx"][:600]

    @PROPS
    @given(mutated(head), st.text(max_size=200))
    def check(data, text):
        bounded(parse_any, data)
        bounded(parse_any, text.encode("utf-8", "surrogatepass"))
        bounded(ptx_version, data)
    check()


@PROPS
@given(st.binary(max_size=2048), st.integers(0, 1 << 24))
def test_lz4_blocks_decode_to_the_declared_size_or_fail(data, size):
    out = bounded(lambda d: lz4.lz4_block_decompress(d, size), data)
    if out is not None:
        assert len(out) == size if size else len(out) <= 255 * len(data) + 16


@PROPS
@given(st.binary(min_size=1, max_size=2048))
def test_lz4_round_trips_through_literals(payload):
    """A block of only literals (what an incompressible input gives) decodes to itself."""
    n = len(payload)
    head = bytes([0xF0]) + (b"\xff" * ((n - 15) // 255) + bytes([(n - 15) % 255]) if n >= 15 else b"")
    block = head + payload if n >= 15 else bytes([n << 4]) + payload
    assert lz4.lz4_block_decompress(block, n) == payload


def _blob(header: dict, code: bytes) -> bytes:
    raw = json.dumps(header).encode()
    digest = hashlib.sha256(raw + code).digest()
    return entry_mod._PREFIX.pack(entry_mod.MAGIC, len(raw), len(code), digest) + raw + code


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


@PROPS
@given(st.dictionaries(st.sampled_from(["key", "kind", "arch", "name", "log", "symbols", "metadata",
                                        "meta", "other"]), _json, max_size=9),
       st.sampled_from(["ptx", "cubin", "fatbin", "hipfb", "ltoir", "object"]),
       st.binary(max_size=512))
def test_entries_with_valid_checksums_but_crafted_headers(header, kind, code):
    """A checksum is no signature: crafted entries pass it, and must still only ever give
    a usable entry or CorruptEntry."""
    if "kind" not in header:
        header["kind"] = kind
    blob = _blob(header, code)
    got = bounded(lambda b: entry_mod.decode(b, None), blob, entry_mod.CorruptEntry)
    if got is not None:
        obj, meta = got
        assert isinstance(meta, dict) and isinstance(obj.code, bytes)


def test_mutated_cache_entries(seeds):
    obj = ObjectCode(seeds["cubin"], kind="cubin", symbols={"a": "b"})
    blob = entry_mod.encode("k" * 64, obj, {"size": 1})

    @PROPS
    @given(mutated(blob))
    def check(data):
        got = bounded(lambda b: entry_mod.decode(b, "k" * 64), data, entry_mod.CorruptEntry)
        assert got is None or got[0] == obj or data == blob
    check()


def test_mutated_export_zips(seeds, tmp_path_factory):
    from kjit.cache import archive
    from kjit.cache.disk import DiskStore
    obj = ObjectCode(seeds["ptx"], kind="ptx")
    key = "ab" * 32
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"entries/{key}", entry_mod.encode(key, obj, {}))
        z.writestr("manifest.json", json.dumps({"format": archive.EXPORT_FORMAT}))
    seed = buf.getvalue()
    root = tmp_path_factory.mktemp("zips")

    @settings(PROPS, max_examples=max(EXAMPLES // 2, 1))
    @given(mutated(seed))
    def check(data):
        with tempfile.TemporaryDirectory(dir=root) as d:
            path = Path(d) / "x.zip"
            path.write_bytes(data)
            store = DiskStore(Path(d) / "cache")
            try:
                r = bounded(lambda _: archive.import_(store, path), data)
                assert r is None or r["imported"] + len(r["rejected"]) + r["already_present"] >= 0
            finally:
                store.close()
    check()


@PROPS
@given(_json, st.binary(max_size=64))
def test_sidecars_are_untrusted_too(side, code):
    d = Path(tempfile.mkdtemp())
    try:
        f = d / "x.ptx"
        f.write_bytes(b".version 8.0\n.target sm_90\n" + code)
        (d / "x.ptx.kjit.json").write_text(json.dumps(side))
        bounded(lambda _: ObjectCode.from_file(f), b"")
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


# --- defect 4: the two bombs ------------------------------------------------------------------------
def lz4_bomb_fatbin(declared: int, run_bytes: int) -> bytes:
    """A fatbin whose one LZ4 entry declares `declared` bytes but whose block is a literal
    and one match run of about 255 * run_bytes bytes."""
    block = bytes([0x1F]) + b"A" + b"\x01\x00" + b"\xff" * run_bytes + b"\x00" + bytes([0x00])
    hdr = containers._ENTRY.size
    entry = containers._ENTRY.pack(1, 0x101, hdr, len(block), len(block), 0, 0, 9, 90, 0, 0,
                                   containers.FLAG_64BIT | containers.FLAG_LINUX | containers.FLAG_LZ4,
                                   0, declared)
    body = entry + block
    return containers._CONTAINER.pack(containers.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_lz4_bomb_stops_at_the_declared_size(tmp_path):
    fat = lz4_bomb_fatbin(64, 2_000_000)  # would decode to 510 MB
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(containers.ContainerFormatError, match="corrupt lz4 entry"):
        containers.read_fatbin(fat)
    seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 0.5 and peak < 3 * len(fat) + (1 << 20)
    from click.testing import CliRunner
    from kjit.cli.main import cli
    f = tmp_path / "bomb.fatbin"
    f.write_bytes(fat)
    t0 = time.perf_counter()
    res = CliRunner().invoke(cli, ["inspect", str(f), "--json"])
    assert time.perf_counter() - t0 < MAX_SECONDS
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 1 and "corrupt lz4 entry" in err["message"] and str(f) in err["message"]
    res = CliRunner().invoke(cli, ["link", str(f), "--arch", "sm_90", "-o", str(tmp_path / "o.cubin")])
    assert res.exit_code == 1 and "corrupt lz4 entry" in res.output


def test_lz4_declared_size_is_capped():
    with pytest.raises(containers.ContainerFormatError, match="more than the"):
        containers.read_fatbin(lz4_bomb_fatbin(containers.MAX_ENTRY_BYTES + 1, 10))
    with pytest.raises(containers.ContainerFormatError, match="cannot decode to"):
        containers.read_fatbin(lz4_bomb_fatbin(10 << 20, 10))  # 16 bytes cannot make 10 MB


def _patch_declared_size(data: bytes, size: int) -> bytes:
    """Set the uncompressed size of the entry members in a zip's central directory."""
    out = bytearray(data)
    at = out.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", out, at + 28)[0]
        if out[at + 46:at + 46 + name_len].startswith(b"entries/"):
            struct.pack_into("<I", out, at + 24, size)
        at = out.find(b"PK\x01\x02", at + 4)
    return bytes(out)


def _zip_with(member: bytes) -> bytes:
    from kjit.cache import archive
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps({"format": archive.EXPORT_FORMAT}))
        z.writestr("entries/" + "cd" * 32, member)
    return buf.getvalue()


def test_zip_bomb_is_refused_from_the_directory_before_inflating(tmp_path):
    from click.testing import CliRunner
    from kjit.cli.main import cli
    bomb = tmp_path / "bomb.zip"
    bomb.write_bytes(_patch_declared_size(_zip_with(b"\0" * 1000), 800 << 20))
    tracemalloc.start()
    res = CliRunner().invoke(cli, ["cache", "import", str(bomb), "--json"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert res.exit_code == 1 and "inflates to 838860800 bytes" in json.loads(res.stdout)["error"]["message"]
    assert peak < 32 << 20


def test_zip_member_inflating_past_its_declared_size_is_cut_off(tmp_path, monkeypatch):
    from kjit import cache
    lying = tmp_path / "lying.zip"
    data = _zip_with(b"\0" * (4 << 20))            # declares 4 MiB, then claims 1000 bytes
    lying.write_bytes(_patch_declared_size(data, 1000))
    r = bounded(lambda _: cache.import_(lying), b"x" * 4096)
    assert r is not None and r["imported"] == 0 and len(r["rejected"]) == 1


def test_zip_larger_than_the_cache_is_refused(tmp_path, monkeypatch):
    from kjit import cache
    monkeypatch.setenv("KJIT_CACHE_SIZE", "1M")
    big = tmp_path / "big.zip"
    big.write_bytes(_zip_with(os.urandom(3 << 20)))
    with pytest.raises(KjitError, match="more than any cache entry may hold"):
        cache.import_(big)


# --- crafted structure: what crashed the linkers, quadratic readers, decode totals -----------------
RDC_SRC = r'''
__device__ __noinline__ float helper(float x) { return x * 2.0f; }
extern "C" __global__ void scale(float* y, int n) { if (n) y[0] = helper(y[0]); }
'''


@pytest.fixture(scope="module")
def rdc_object() -> bytes:
    from kjit.compiler.options import CompileOptions
    return kjit_compile(RDC_SRC, arch="sm_90", options=CompileOptions(relocatable=True), cache=False).code


def _faults(obj: bytes) -> dict[str, bytes]:
    """Edits of a real -rdc object that crash nvJitLink (each a segfault before it was checked)."""
    from crafted import (nvinfo_offset, patch_section, section_index as si, set_section, set_symbol,
                         symbol_index)
    helper, text = symbol_index(obj, "_Z6helperf"), si(obj, ".text.scale")
    graph = obj[ElfFile(obj).section(".nv.callgraph").offset:][:ElfFile(obj).section(".nv.callgraph").size]
    callee = [k for k in range(0, len(graph), 4) if graph[k:k + 4] == struct.pack("<I", helper)][0]
    return {
        "REGCOUNT of no function": patch_section(obj, ".nv.info", nvinfo_offset(obj, ".nv.info", 0x2F),
                                                 b"\xff\xff\x00\x00"),
        "call graph edge to a section": patch_section(obj, ".nv.callgraph", callee, b"\x01\0\0\0"),
        "prototype of no function": patch_section(obj, ".nv.prototype", 0, b"\0\0\0\0"),
        "PARAM_CBANK of no symbol": patch_section(
            obj, ".nv.info.scale", nvinfo_offset(obj, ".nv.info.scale", 0x0A), b"\x13\x04\0\0"),
        "rela sh_info 0xFFFFFFFF": set_section(obj, si(obj, ".rela.debug_frame"), "info", 0xFFFFFFFF),
        ".nv.info sh_info past the sections": set_section(obj, si(obj, ".nv.info.scale"), "info", 0x10000),
        ".debug_frame sh_info": set_section(obj, si(obj, ".debug_frame"), "info", 0x7FFFFFFF),
        ".text sh_info names no function": set_section(obj, text, "info", 0x0100000F),
        "symbol table misaligned": set_section(obj, si(obj, ".symtab"), "offset", 0x13),
        "symbol table entry size": set_section(obj, si(obj, ".symtab"), "entsize", 0x13),
        ".nv.prototype size": set_section(obj, si(obj, ".nv.prototype"), "size", 0x13),
        "function symbol as an object": set_symbol(obj, helper, "info", (1 << 4) | 1),
        "function in SHN_ABS": set_symbol(obj, helper, "shndx", 0xFFF1),
        "symbol in section 500": set_symbol(obj, helper, "shndx", 500),
        "symbol name past the string table": set_symbol(obj, helper, "name", 0xFFFFFFF0),
    }


FAULTS = [".nv.info sh_info past the sections", "rela sh_info 0xFFFFFFFF", ".debug_frame sh_info",
          ".text sh_info names no function", "symbol table misaligned", "symbol table entry size",
          ".nv.prototype size", "function symbol as an object", "function in SHN_ABS",
          "symbol in section 500", "symbol name past the string table", "REGCOUNT of no function",
          "call graph edge to a section", "prototype of no function", "PARAM_CBANK of no symbol"]


@pytest.mark.parametrize("fault", FAULTS)
def test_link_refuses_elf_structure_that_crashes_the_linker(rdc_object, tmp_path, fault):
    """`kjit link` exits 1 naming the file and the fault, where nvJitLink segfaulted (139)."""
    import subprocess
    import sys
    bad = tmp_path / "bad.o"
    bad.write_bytes(_faults(rdc_object)[fault])
    res = subprocess.run([sys.executable, "-m", "kjit", "link", str(bad), "--arch", "sm_90",
                          "-o", str(tmp_path / "out.cubin"), "--no-cache", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, (res.returncode, res.stderr[-300:])
    err = json.loads(res.stdout)["error"]["message"]
    assert str(bad) in err and "corrupt ELF, not linked" in err
    if fault == "rela sh_info 0xFFFFFFFF":
        assert ".rela.debug_frame" in err and "sh_info 4294967295" in err


def test_link_still_takes_the_unedited_object(rdc_object):
    from kjit.linker import link
    assert link([rdc_object], arch="sm_90", backend="nvjitlink", cache=False).object.entry_points == ("scale",)


def test_crafted_cubin_inside_a_fatbin_is_refused_before_linking(rdc_object):
    from crafted import fatbin, fatbin_entry
    from kjit.linker import link
    bad = _faults(rdc_object)["rela sh_info 0xFFFFFFFF"]
    with pytest.raises(KjitError, match=r"fatbin entry 0 \(sm_90\), not linked: .*sh_info 4294967295"):
        link([fatbin(fatbin_entry(bad))], arch="sm_90", backend="nvjitlink", cache=False)


def test_crafted_cubin_inside_a_host_object_is_refused_before_linking(rdc_object):
    from crafted import fatbin, fatbin_entry, host_object
    from kjit.linker.inputs import normalize
    assert normalize([host_object(fatbin(fatbin_entry(rdc_object)))])[0].kind == "hostobject"
    bad = host_object(fatbin(fatbin_entry(_faults(rdc_object)["rela sh_info 0xFFFFFFFF"])))
    with pytest.raises(KjitError, match=r"link input #0 \(bytes\): corrupt ELF in fatbin entry 0"):
        normalize([bad])


@pytest.mark.parametrize("stride", [0, 24])
def test_thousands_of_overlapping_symbol_tables_take_no_time(rdc_object, tmp_path, stride):
    """2000 SYMTAB sections over one symbol table (identical or shifted) took 30 s to inspect:
    the readers refuse them, in linear time."""
    from click.testing import CliRunner
    from crafted import many_symtabs
    from kjit.cli.main import cli
    f = tmp_path / "many.cubin"
    f.write_bytes(many_symtabs(rdc_object, 2000, stride))
    t0 = time.perf_counter()
    res = CliRunner().invoke(cli, ["inspect", str(f), "--json"])
    assert time.perf_counter() - t0 < MAX_SECONDS
    note = json.loads(res.stdout)["entries"][0]["note"]
    assert res.exit_code == 0 and ("2001 symbol tables" in note if not stride else "overlap" in note)
    with pytest.raises(KjitError, match="symbol tables|overlap"):
        parse_elf(f.read_bytes())
    assert bounded(parse_elf, f.read_bytes()) is None


def test_lz4_entries_have_a_total_budget_checked_before_decoding():
    """Four entries of 300 MiB each (1.2 GB in all, each under the per-entry cap) are refused
    from their headers: nothing is decoded."""
    from crafted import lz4_fatbin
    fat = lz4_fatbin(*[300 << 20] * 4)
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(containers.ContainerFormatError, match=r"declare 1258291200 bytes in all"):
        containers.read_fatbin(fat)
    peak, seconds = tracemalloc.get_traced_memory()[1], time.perf_counter() - t0
    tracemalloc.stop()
    assert seconds < MAX_SECONDS and peak < 3 * len(fat) + (1 << 20)


def test_lz4_budget_counts_every_entry(monkeypatch):
    from crafted import lz4_fatbin
    monkeypatch.setattr(containers, "MAX_TOTAL_BYTES", 8 << 20)
    assert [e.size for e in containers.read_fatbin(lz4_fatbin(4 << 20, 4 << 20))] == [4 << 20] * 2
    with pytest.raises(containers.ContainerFormatError, match="in all"):
        containers.read_fatbin(lz4_fatbin(4 << 20, 4 << 20, 1 << 20))


def test_zstd_entry_of_undeclared_size_stops_at_the_budget(monkeypatch):
    zstandard = pytest.importorskip("zstandard")
    from crafted import fatbin, fatbin_entry
    monkeypatch.setattr(containers, "MAX_TOTAL_BYTES", 1 << 20)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (64 << 20))
    fat = fatbin(fatbin_entry(frame, flags=containers.FLAG_ZSTD, compressed=len(frame)))
    tracemalloc.start()
    with pytest.raises(containers.ContainerFormatError, match="budget"):
        containers.read_fatbin(fat)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20


def test_offload_bundle_entries_may_not_overlap():
    """2000 entries over one 64 KiB code object would be 128 MB of copies."""
    from crafted import bundle as make_bundle
    tail = bytes(64 << 10)
    head = len(make_bundle([("hipv4-amdgcn-amd-amdhsa--gfx90a", 0, 0)] * 2000, b""))
    data = make_bundle([("hipv4-amdgcn-amd-amdhsa--gfx90a", head, len(tail))] * 2000, tail)
    tracemalloc.start()
    with pytest.raises(KjitError, match="entries overlap"):
        parse_bundle(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * len(data)
