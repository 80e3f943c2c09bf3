"""Structure-aware fuzzing of the readers of untrusted bytes: ELF (and the linker's structure
check), .nv.info, LZ4, fatbins, offload bundles and cache export archives.

Each strategy builds a *valid* container from its parts (sections, symbols, records,
sequences, entries, zip members), so the reader is known to return exactly those parts;
then a mutation sets the fields readers trust (offsets, sizes, counts, indexes, formats) to
boundary values, neighbours or each other. The property for every input: a result, or
kjit's own error (a KjitError), never another exception, within MAX_SECONDS and a memory
peak the input size justifies. KJIT_FUZZ_EXAMPLES=20000 for a deep run by hand.
"""
from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kjit.errors import KjitError
from kjit.formats import bundle as bundle_mod
from kjit.formats import fatbin as containers
from kjit.formats import lz4, nvinfo
from kjit.formats.elf import ElfFile
from kjit.formats.elfcheck import check_linkable
from kjit.objectcode import ObjectCode

from crafted import fatbin_entry
from test_untrusted_bytes import MAX_SECONDS, bounded

EXAMPLES = int(os.environ.get("KJIT_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=int(MAX_SECONDS * 2500), database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BOUNDARY = [0, 1, 2, 3, 4, 7, 8, 15, 16, 23, 24, 63, 64, 0x7F, 0xFF, 0x100, 0xFFFF, 0x10000,
            0x7FFFFFFF, 0xFFFFFFFF, 1 << 32, 1 << 62, (1 << 64) - 1]


@st.composite
def edits(draw, fields: list[tuple[int, int]], size: int):
    """1-4 (offset, width, value) edits of the given fields (offset, width), values from the
    boundaries, small numbers, the input's size and the fields' own offsets."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        at, width = draw(st.sampled_from(fields))
        value = draw(st.sampled_from(BOUNDARY + [size, size - 1, size + 1, at, at + width])
                     | st.integers(0, 64))
        out.append((at, width, value % (1 << (8 * width))))
    return out


def apply(data: bytes, changes) -> bytes:
    out = bytearray(data)
    for at, width, value in changes:
        if at + width <= len(out):
            out[at:at + width] = value.to_bytes(width, "little")
    return bytes(out)


# --- .nv.info records ---------------------------------------------------------------------------
record = st.one_of(
    st.tuples(st.just(1), st.integers(0, 255), st.none()),
    st.tuples(st.just(2), st.integers(0, 255), st.integers(0, 255)),
    st.tuples(st.just(3), st.integers(0, 255), st.integers(0, 0xFFFF)),
    st.tuples(st.just(4), st.integers(0, 255), st.binary(max_size=40).map(lambda b: b[:len(b) // 4 * 4])))


def encode_nvinfo(records) -> bytes:
    out = bytearray()
    for fmt, code, value in records:
        out += bytes([fmt, code])
        out += (b"\0\0" if value is None else bytes([value, 0]) if fmt == 2 else
                struct.pack("<H", value) if fmt == 3 else struct.pack("<H", len(value)) + value)
    return bytes(out)


@FUZZ
@given(st.lists(record, max_size=12), st.data())
def test_nvinfo_records_round_trip_and_survive_cuts(records, data):
    raw = encode_nvinfo(records)
    assert [(a.format, a.code, a.value) for a in nvinfo.parse_nvinfo(raw)] == list(records)
    cut = data.draw(st.integers(0, len(raw)))
    fields = [(i, 1) for i in range(0, max(len(raw), 1))]
    bad = apply(raw[:cut], data.draw(edits(fields, len(raw)))) if raw else raw
    bounded(nvinfo.parse_nvinfo, bad)


# --- LZ4 blocks -----------------------------------------------------------------------------------
def _length(n: int) -> bytes:
    return b"\xff" * ((n - 15) // 255) + bytes([(n - 15) % 255]) if n >= 15 else b""


@st.composite
def lz4_block(draw):
    """(block, what it decodes to): sequences of literals and back-references, then literals."""
    out, block = bytearray(), bytearray()
    for _ in range(draw(st.integers(0, 5))):
        lit = draw(st.binary(min_size=0 if out else 1, max_size=40))
        out += lit
        offset = draw(st.integers(1, len(out)))
        mlen = draw(st.integers(4, 600))
        block += bytes([(min(len(lit), 15) << 4) | min(mlen - 4, 15)]) + _length(len(lit)) + lit
        block += struct.pack("<H", offset) + _length(mlen - 4)
        for _ in range(mlen):
            out.append(out[-offset])
    lit = draw(st.binary(max_size=40))
    block += bytes([min(len(lit), 15) << 4]) + _length(len(lit)) + lit
    return bytes(block), bytes(out + lit)


@FUZZ
@given(lz4_block(), st.data())
def test_lz4_blocks_decode_exactly_or_fail(pair, data):
    block, plain = pair
    assert lz4.lz4_block_decompress(block, len(plain)) == plain
    size = max(data.draw(st.sampled_from([len(plain), 0, len(plain) - 1, len(plain) + 1, 1 << 30])), 0)
    bad = apply(block, data.draw(edits([(i, 1) for i in range(len(block))], len(block))))
    got = bounded(lambda b: lz4.lz4_block_decompress(b, size), bad)
    assert got is None or size == 0 or len(got) == size


# --- fatbins --------------------------------------------------------------------------------------
@st.composite
def fatbins(draw):
    """(fatbin, [(kind, arch, code)]): one or two containers of PTX / cubin / LTO-IR entries,
    stored plain, LZ4 or (with the zstandard package) zstd."""
    parts, want = [], []
    for _ in range(draw(st.integers(1, 2))):
        body = b""
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from([1, 2, 8]))
            sm = draw(st.sampled_from([75, 80, 90, 100]))
            plain = (b".version 8.0\n.target sm_%d\n" % sm) + draw(st.binary(max_size=64)).replace(b"\0", b"x") \
                if kind == 1 else b"\xed\x43\x4e\x7f" + draw(st.binary(max_size=64)) if kind == 8 else \
                b"CUBIN" + draw(st.binary(max_size=64))
            how = draw(st.sampled_from(["plain", "lz4", "zstd"]))
            if how == "lz4":
                block = bytes([0xF0]) + _length(len(plain)) + plain if len(plain) >= 15 else \
                    bytes([len(plain) << 4]) + plain
                body += fatbin_entry(block, kind=kind, sm=sm, flags=containers.FLAG_LZ4,
                                     declared=len(plain), compressed=len(block))
            elif how == "zstd" and _zstd() is not None:
                frame = _zstd().ZstdCompressor().compress(plain)
                body += fatbin_entry(frame, kind=kind, sm=sm, flags=containers.FLAG_ZSTD,
                                     declared=len(plain), compressed=len(frame))
            else:
                body += fatbin_entry(plain, kind=kind, sm=sm)
            want.append(({1: "ptx", 2: "cubin", 8: "ltoir"}[kind],
                          f"{'compute' if kind == 1 else 'sm'}_{sm}", plain))
        parts.append(containers._CONTAINER.pack(containers.FATBIN_MAGIC, 1, 16, len(body)) + body)
    return b"".join(parts), want


def _zstd():
    try:
        import zstandard
        return zstandard
    except ImportError:
        return None


def _fatbin_fields(data: bytes) -> list[tuple[int, int]]:
    """Where the container and entry headers keep their numbers."""
    fields, off = [], 0
    while off + 16 <= len(data):
        fields += [(off + 6, 2), (off + 8, 8)]
        _m, _v, hsize, body = containers._CONTAINER.unpack_from(data, off)
        pos, end = off + hsize, off + hsize + body
        while pos + containers._ENTRY.size <= min(end, len(data)):
            fields += [(pos + a, w) for a, w in ((0, 2), (4, 4), (8, 8), (16, 4), (20, 4), (28, 4),
                                                 (32, 4), (36, 4), (40, 8), (56, 8))]
            pos += struct.unpack_from("<I", data, pos + 4)[0] + struct.unpack_from("<Q", data, pos + 8)[0]
        off = end
    return fields


@FUZZ
@given(fatbins(), st.data())
def test_fatbins_read_back_and_survive_field_edits(pair, data):
    fat, want = pair
    got = containers.read_fatbin(fat)
    assert [(e.kind, e.arch, e.code.rstrip(b"\0") if e.kind == "ptx" else e.code) for e in got] == \
        [(k, a, c.rstrip(b"\0") if k == "ptx" else c) for k, a, c in want]
    bad = apply(fat, data.draw(edits(_fatbin_fields(fat), len(fat))))
    bounded(containers.read_fatbin, bad)
    bounded(lambda d: ObjectCode(d).entry_points, bad)


# --- offload bundles ------------------------------------------------------------------------------
@st.composite
def bundles(draw):
    codes = draw(st.lists(st.binary(min_size=1, max_size=80), min_size=1, max_size=4))
    ids = ["host-x86_64-unknown-linux--"] + [f"hipv4-amdgcn-amd-amdhsa--gfx90{i}" for i in range(len(codes))]
    codes = [b""] + codes
    head = 24 + 8 + sum(24 + len(i) for i in ids)
    offsets, cursor = [], head
    for c in codes:
        offsets.append(cursor)
        cursor += len(c)
    out = bytearray(b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(ids)))
    fields = [(24, 8)]
    for eid, c, off in zip(ids, codes, offsets):
        fields += [(len(out), 8), (len(out) + 8, 8), (len(out) + 16, 8)]
        out += struct.pack("<QQQ", off, len(c), len(eid)) + eid.encode()
    return bytes(out) + b"".join(codes), codes, fields


@FUZZ
@given(bundles(), st.data())
def test_bundles_read_back_and_survive_field_edits(triple, data):
    raw, codes, fields = triple
    assert [e.code for e in bundle_mod.read_bundle(raw)] == codes
    bad = apply(raw, data.draw(edits(fields, len(raw))))
    bounded(bundle_mod.read_bundle, bad)
    bounded(lambda d: containers.entries(d, "hipfb"), bad)


# --- CUDA ELF images ------------------------------------------------------------------------------
@st.composite
def cuda_elves(draw):
    """(ELF bytes, kernel names, field locations): an ET_REL CUDA ELF built section by section
    with a symbol table, per-function .text/.nv.info sections, a global .nv.info with
    REGCOUNT records and relocations; the layout check_linkable and nvJitLink expect."""
    nfunc = draw(st.integers(1, 3))
    funcs = [f"f{i}" for i in range(nfunc)]
    kernels = [f for f in funcs if draw(st.booleans())]
    # sections: 1 .shstrtab, 2 .strtab, 3 .symtab, 4 .nv.info, then per function .text, .nv.info.f, .rela.text
    names = [".shstrtab", ".strtab", ".symtab", ".nv.info"]
    for f in funcs:
        names += [f".text.{f}", f".nv.info.{f}", f".rela.text.{f}"]
    shstr = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    strtab = b"\0" + b"".join(f.encode() + b"\0" for f in funcs)
    text_index = {f: 5 + 3 * i for i, f in enumerate(funcs)}
    syms = [bytes(24)]
    for i, f in enumerate(funcs):
        name_off = strtab.index(f.encode() + b"\0")
        syms.append(struct.pack("<IBBHQQ", name_off, (1 << 4) | 2, 0x10 if f in kernels else 0,
                                text_index[f], 0, 16))
    symtab = b"".join(syms)
    glob = encode_nvinfo([(4, 0x2F, struct.pack("<II", 1 + i, draw(st.integers(0, 255))))
                          for i in range(nfunc)])
    contents = {".shstrtab": shstr, ".strtab": strtab, ".symtab": symtab, ".nv.info": glob}
    for i, f in enumerate(funcs):
        contents[f".text.{f}"] = draw(st.binary(min_size=16, max_size=48))
        recs = [(4, 0x0A, b"\0" * 8), (3, 0x19, 8)] if f in kernels else [(4, 0x37, b"\x80\0\0\0")]
        contents[f".nv.info.{f}"] = encode_nvinfo(recs)
        contents[f".rela.text.{f}"] = struct.pack("<QQq", 0, ((1 + i) << 32) | 1, 0)
    info = {".symtab": 1, ".nv.info": 0}
    link = {".symtab": 2, ".nv.info": 3}
    kind = {".shstrtab": 3, ".strtab": 3, ".symtab": 2, ".nv.info": 0x70000000}
    flags, ent = {}, {".symtab": 24}
    for i, f in enumerate(funcs):
        kind.update({f".text.{f}": 1, f".nv.info.{f}": 0x70000000, f".rela.text.{f}": 4})
        flags.update({f".text.{f}": 6, f".nv.info.{f}": 0x40, f".rela.text.{f}": 0x40})
        info.update({f".text.{f}": 1 + i, f".nv.info.{f}": text_index[f], f".rela.text.{f}": text_index[f]})
        link.update({f".text.{f}": 3, f".nv.info.{f}": 3, f".rela.text.{f}": 3})
        ent[f".rela.text.{f}"] = 24
    body, headers, fields = bytearray(b"\0" * 64), [bytes(64)], []
    for n in names:
        while len(body) % 8:
            body += b"\0"
        off = len(body)
        body += contents[n]
        headers.append(struct.pack("<IIQQQQIIQQ", shstr.index(n.encode() + b"\0"), kind[n],
                                   flags.get(n, 0), 0, off, len(contents[n]), link.get(n, 0),
                                   info.get(n, 0), 8, ent.get(n, 0)))
    while len(body) % 8:
        body += b"\0"
    shoff = len(body)
    for i in range(len(headers)):
        fields += [(shoff + 64 * i + a, w) for a, w in ((4, 4), (24, 8), (32, 8), (40, 4), (44, 4), (56, 8))]
    sym_at = 64 + sum(-(-len(contents[n]) // 8) * 8 for n in names[:2])
    fields += [(sym_at + 24 * k + a, w) for k in range(len(syms)) for a, w in ((0, 4), (4, 1), (5, 1), (6, 2))]
    fields += [(40, 8), (58, 2), (60, 2), (62, 2)]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33, 7]) + bytes(7)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 1, 190, 1, 0, 0, shoff, 90 | (90 << 16), 64, 0, 0,
                                 64, len(headers), 1)
    return header + bytes(body[64:]) + b"".join(headers), sorted(kernels), fields


def _read_elf(data: bytes):
    elf = ElfFile(data)
    return elf.sections, elf.symbols, elf.cuda_kernels(), nvinfo.kernel_resources(data)


@FUZZ
@given(cuda_elves(), st.data())
def test_cuda_elves_read_back_and_survive_field_edits(triple, data):
    elf, kernels, fields = triple
    check_linkable(elf)
    assert ElfFile(elf).cuda_kernels() == kernels
    assert [k.name for k in nvinfo.kernel_resources(elf)] == kernels
    bad = apply(elf, data.draw(edits(fields, len(elf))))
    bounded(check_linkable, bad)
    bounded(_read_elf, bad)
    bounded(lambda d: ObjectCode(d).entry_points, bad)


# --- cache export archives ------------------------------------------------------------------------
def _zip_fields(raw: bytes) -> list[tuple[int, int]]:
    """The numbers of the zip's local headers, central directory and end record."""
    fields = []
    for sig, spots in ((b"PK\x03\x04", ((8, 2), (18, 4), (22, 4), (26, 2), (28, 2))),
                       (b"PK\x01\x02", ((10, 2), (20, 4), (24, 4), (28, 2), (30, 2), (42, 4))),
                       (b"PK\x05\x06", ((8, 2), (10, 2), (12, 4), (16, 4)))):
        at = raw.find(sig)
        while at >= 0:
            fields += [(at + a, w) for a, w in spots]
            at = raw.find(sig, at + 4)
    return fields


@settings(FUZZ, max_examples=max(EXAMPLES // 3, 1))
@given(payloads=st.lists(st.binary(max_size=2000), min_size=1, max_size=3), data=st.data())
def test_export_archives_survive_directory_edits(tmp_path_factory, payloads, data):
    from kjit.cache import archive
    from kjit.cache import entry as entry_mod
    from kjit.cache.disk import DiskStore
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i, p in enumerate(payloads):
            key = f"{i:02x}" * 32
            obj = ObjectCode(b".version 8.0\n.target sm_90\n" + p.replace(b"\0", b" "), kind="ptx")
            z.writestr(f"entries/{key}", entry_mod.encode(key, obj, {}))
        z.writestr("manifest.json", json.dumps({"format": archive.EXPORT_FORMAT}))
    raw = buf.getvalue()
    bad = apply(raw, data.draw(edits(_zip_fields(raw), len(raw))))
    with tempfile.TemporaryDirectory(dir=tmp_path_factory.getbasetemp()) as d:
        path = Path(d) / "x.zip"
        path.write_bytes(bad)
        store = DiskStore(Path(d) / "cache")
        try:
            bounded(lambda _: archive.import_(store, path), bad + bytes(1 << 16))
        finally:
            store.close()


def test_the_strategies_build_what_the_readers_accept():
    """The seeds of the fuzzers are valid (else every mutation would test only refusal)."""
    from hypothesis import find
    elf, kernels, _ = find(cuda_elves(), lambda t: len(t[1]) == 2)
    assert check_linkable(elf) and ElfFile(elf).cuda_kernels() == kernels
    fat, want = find(fatbins(), lambda p: len(p[1]) >= 3)
    assert len(containers.read_fatbin(fat)) == len(want)
    with pytest.raises(KjitError):
        check_linkable(elf[:63])
