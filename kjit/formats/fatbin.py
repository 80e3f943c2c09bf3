"""CUDA fatbins, both ways: read the entries of multi-architecture containers (fatbins and,
through `bundle`, HIP offload bundles) and write a fatbin with nvFatbin.

A CUDA fatbin is one or more containers, each a 16-byte header (magic 0xBA55ED50, version,
header size, size of what follows) and a run of entries. Each entry has its own header
(kind PTX/ELF/LTO-IR, SM number, payload size, flags, compression) followed by the payload.
The layout is not documented by NVIDIA; the fields below are the ones nvFatbin, nvcc and
cuobjdump agree on (checked against `cuobjdump --list-elf --list-ptx` in the tests).

`entries(code, kind)` works for every kind of ObjectCode: a fatbin or bundle gives one Entry
per payload, anything else gives itself as the only entry, so callers need not special-case.

`write_fatbin` leaves the layout to nvFatbin, NVIDIA's own writer (the reader here is checked
against what it writes), loaded only when a fatbin is written; reading needs no CUDA library.
It takes FatbinInputs or anything shaped like an ObjectCode (kind, arch, code, name), so this
layer stays below objectcode; `kjit.build.pack` wraps the bytes in an ObjectCode.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterable

from .. import arch as arch_mod
from ..errors import InvalidOptionError, KjitError
from .elf import NOBITS_TYPES
from .lz4 import lz4_block_decompress
from .sniff import arch_from_bytes, ptx_version, sniff_kind

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")     # magic, version, header size, size of the entries
# kind, version, header size, payload size, compressed size, options offset, minor, major,
# arch, identifier offset, identifier length, flags, (reserved), uncompressed size
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")

ENTRY_KINDS = {1: "ptx", 2: "cubin", 8: "ltoir"}

FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_LINUX = 0x10
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_OBFUSCATED = 0x10000      # LTO-IR stored in a form only NVIDIA's tools decode
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a, compute_100a
FLAG_FAMILY = 0x200000         # sm_100f, compute_100f


class ContainerFormatError(InvalidOptionError):
    """The bytes claim to be a fatbin (or bundle) but are truncated or malformed."""


@dataclass(frozen=True)
class Entry:
    """One payload of a container.

    kind: cubin, ptx, ltoir (CUDA) or hsaco (HIP); arch: sm_90, sm_90a, compute_90, gfx90a;
    code: the payload, decompressed where kjit can (see `decoded`); name: the identifier
    the producer gave it; stored_size: bytes it takes in the container; compression: None,
    "lz4" or "zstd"; decoded: False when `code` is still the stored (compressed) form;
    ptx_version: (major, minor) of a PTX entry; options: JIT options stored with PTX.
    """

    kind: str
    arch: str
    code: bytes
    name: str = ""
    stored_size: int = 0
    compression: str | None = None
    decoded: bool = True
    ptx_version: tuple[int, int] | None = None
    options: str = ""
    flags: int = 0
    note: str = ""

    @property
    def compressed(self) -> bool:
        return self.compression is not None

    @property
    def size(self) -> int:
        return len(self.code)

    def describe(self) -> dict[str, Any]:
        """JSON-able summary (no payload)."""
        return {"kind": self.kind, "arch": self.arch, "size": self.size,
                "stored_size": self.stored_size or self.size, "name": self.name,
                "compressed": self.compressed, "compression": self.compression,
                "decoded": self.decoded,
                "ptx_version": ".".join(map(str, self.ptx_version)) if self.ptx_version else None,
                "options": self.options, **({"note": self.note} if self.note else {})}


def entries(code: bytes, kind: str | None = None) -> list[Entry]:
    """The payloads of `code`. Fatbins are parsed here; "hipfb" (clang offload bundles) is
    read by kjit.hip.bundle; any other kind is returned as a single entry of itself."""
    code = bytes(code)
    if not kind:
        kind = sniff_kind(code)
    if kind == "fatbin":
        return read_fatbin(code)
    if kind == "hipfb":
        from .bundle import read_bundle
        return [e if isinstance(e, Entry) else
                Entry(kind=e.kind, arch=e.arch, code=bytes(e.code),
                      name=getattr(e, "entry_id", "") or "", stored_size=len(e.code))
                for e in read_bundle(code)]
    if kind in ("cubin", "object"):
        kind = sniff_kind(code)  # e_type decides between the two
    return [Entry(kind=kind, arch=arch_from_bytes(code, kind) or "", code=code,
                  stored_size=len(code), ptx_version=ptx_version(code) if kind == "ptx" else None)]


def runs_on(entry_arch: str, device_arch: str) -> bool:
    """Whether the driver can use an entry built for `entry_arch` on a `device_arch` GPU.

    cubin sm_XY: same major, minor >= Y; PTX compute_XY: any sm >= XY (JIT); the
    arch-specific sm_XYa / compute_XYa: exactly XY; the family sm_XYf / compute_XYf: same
    major, minor >= Y."""
    e, d = arch_mod.parse(entry_arch), arch_mod.parse(device_arch)
    if e.suffix == "a":
        return e.number == d.number
    if e.virtual and not e.suffix:
        return d.number >= e.number
    return e.number // 10 == d.number // 10 and d.number >= e.number


def best_entry(items: list[Entry], device_arch: str) -> Entry | None:
    """The entry the driver would use on `device_arch` (sm_90): the closest cubin, else
    the newest PTX it can JIT, else None. Undecodable entries count too (the driver
    decodes them), so check `.decoded` before using `.code`."""
    def number(e: Entry) -> int:
        return int("".join(ch for ch in e.arch.split("_", 1)[1] if ch.isdigit()))
    cubins = [e for e in items if e.kind == "cubin" and runs_on(e.arch, device_arch)]
    if cubins:
        return max(cubins, key=lambda e: (number(e), e.arch.endswith("a")))
    ptx = [e for e in items if e.kind == "ptx" and runs_on(e.arch, device_arch)]
    return max(ptx, key=number) if ptx else None


def read_fatbin(data: bytes) -> list[Entry]:
    """Every entry of every container in a fatbin image (e.g. a .fatbin file or an
    .nv_fatbin section). Raises ContainerFormatError naming the offset of what is wrong.

    Decoding is budgeted as a whole, not only per entry: the declared sizes of all
    compressed entries together may not pass MAX_TOTAL_BYTES, checked from the headers
    before anything is decoded."""
    data = bytes(data)
    spans = _entry_spans(data)
    declared = 0
    for pos, _end in spans:
        flags, size = _ENTRY.unpack_from(data, pos)[11], _ENTRY.unpack_from(data, pos)[13]
        if flags & (FLAG_LZ4 | FLAG_ZSTD):
            declared += size
    if declared > MAX_TOTAL_BYTES:
        raise ContainerFormatError(
            f"fatbin's compressed entries declare {declared} bytes in all, more than the "
            f"{MAX_TOTAL_BYTES} kjit decodes from one fatbin (crafted, or split it)")
    budget = [MAX_TOTAL_BYTES]
    return [_read_entry(data, pos, end, budget) for pos, end in spans]


def _entry_spans(data: bytes) -> list[tuple[int, int]]:
    """(offset of the entry header, end of its container) of every entry, headers checked."""
    out: list[tuple[int, int]] = []
    off = 0
    while off < len(data):
        if len(data) - off < _CONTAINER.size:
            if not data[off:].strip(b"\0"):
                break  # zero padding after the last container
            raise ContainerFormatError(
                f"fatbin truncated: {len(data) - off} stray bytes at offset {off}, too few for "
                "a container header")
        magic, _version, header_size, body_size = _CONTAINER.unpack_from(data, off)
        if magic != FATBIN_MAGIC:
            if off and not data[off:].strip(b"\0"):
                break
            raise ContainerFormatError(
                f"not a fatbin container at offset {off}: magic 0x{magic:08X}, expected "
                f"0x{FATBIN_MAGIC:08X}")
        if header_size < _CONTAINER.size:
            raise ContainerFormatError(f"fatbin container at offset {off}: bad header size {header_size}")
        start, end = off + header_size, off + header_size + body_size
        if end > len(data):
            raise ContainerFormatError(
                f"fatbin truncated: the container at offset {off} declares {body_size} bytes of "
                f"entries but only {len(data) - start} remain (file cut short?)")
        pos = start
        while pos < end:
            if end - pos < _ENTRY.size:
                raise ContainerFormatError(
                    f"fatbin truncated: entry header at offset {pos} needs {_ENTRY.size} bytes, "
                    f"{end - pos} remain")
            header_size, payload_size = struct.unpack_from("<IQ", data, pos + 4)
            if header_size < _ENTRY.size or pos + header_size + payload_size > end:
                raise ContainerFormatError(
                    f"fatbin truncated or corrupt: entry at offset {pos} declares a {header_size}-"
                    f"byte header and {payload_size}-byte payload, but its container ends at {end}")
            out.append((pos, end))
            pos += header_size + payload_size
        off = end
    if not out and not data.startswith(struct.pack("<I", FATBIN_MAGIC)):
        raise ContainerFormatError("not a fatbin: no container header found")
    return out


def _read_entry(data: bytes, pos: int, end: int, budget: list[int]) -> Entry:
    """The entry whose header `_entry_spans` found at `pos`; budget[0]: bytes still to decode."""
    (kind_code, _ver, header_size, payload_size, compressed_size, options_off, minor, major,
     sm, name_off, name_len, flags, _reserved, uncompressed_size) = _ENTRY.unpack_from(data, pos)
    header = data[pos:pos + header_size]
    name = _cstring(header, name_off, name_len)
    options = _options(header, options_off)
    kind = ENTRY_KINDS.get(kind_code, f"kind{kind_code}")
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
    arch = f"{'compute' if kind == 'ptx' else 'sm'}_{sm}{suffix}"
    stored = data[pos + header_size:pos + header_size + payload_size]
    compression = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else None
    code, decoded, note = stored, True, ""
    if compression:
        stored = stored[:compressed_size] if compressed_size else stored
        code, note = _decompress(compression, stored, uncompressed_size, flags, budget[0])
        budget[0] -= len(code or b"")
        decoded = code is not None
        code = code if code is not None else stored
    elif flags & FLAG_OBFUSCATED:
        decoded, note = False, "stored in a form only NVIDIA's tools decode"
    if decoded:
        code = _trim(kind, code)
    entry = Entry(kind=kind, arch=arch, code=code, name=name, stored_size=payload_size,
                  compression=compression, decoded=decoded,
                  ptx_version=(major, minor) if kind == "ptx" else None, options=options,
                  flags=flags, note=note)
    return entry


def _cstring(header: bytes, off: int, length: int) -> str:
    if not off or off >= len(header):
        return ""
    raw = header[off:off + length] if length else header[off:]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _options(header: bytes, off: int) -> str:
    # The options block is (u32 offset of the text from the entry header, u32 length).
    if not off or off + 8 > len(header):
        return ""
    text_off, length = struct.unpack_from("<II", header, off)
    if not length or text_off + length > len(header):
        return ""
    return header[text_off:text_off + length].split(b"\0", 1)[0].decode("utf-8", "replace")


def _trim(kind: str, code: bytes) -> bytes:
    """Drop the zero padding the container adds after a payload."""
    if kind == "ptx":
        return code.rstrip(b"\0")
    if kind == "cubin" and code[:4] == b"\x7fELF":
        return code[:_elf_extent(code)]
    return code


def _elf_extent(code: bytes) -> int:
    """The length of an ELF64 image: the furthest end of its headers and sections."""
    if len(code) < 64:
        return len(code)
    phoff, shoff = struct.unpack_from("<QQ", code, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", code, 54)
    extent = max(64, phoff + phentsize * phnum, shoff + shentsize * shnum)
    for i in range(shnum):
        at = shoff + i * shentsize
        if at + 64 > len(code):
            return len(code)
        sh_type, = struct.unpack_from("<I", code, at + 4)
        sh_off, sh_size = struct.unpack_from("<QQ", code, at + 24)
        if sh_type not in NOBITS_TYPES:  # these occupy no file space
            extent = max(extent, sh_off + sh_size)
    return min(extent, len(code))


# A fatbin entry's declared uncompressed size is trusted only this far: decoding never
# holds more than the declared size, and the declared size itself is capped.
MAX_ENTRY_BYTES = 1 << 30
# ...and all entries of one fatbin together decode to at most this much.
MAX_TOTAL_BYTES = 1 << 30


def _decompress(method: str, stored: bytes, size: int, flags: int,
                budget: int = MAX_TOTAL_BYTES) -> tuple[bytes | None, str]:
    if flags & FLAG_OBFUSCATED:
        return None, "compressed and stored in a form only NVIDIA's tools decode"
    if size > MAX_ENTRY_BYTES:
        raise ContainerFormatError(f"corrupt {method} entry in fatbin: it declares {size} "
                                   f"uncompressed bytes, more than the {MAX_ENTRY_BYTES} kjit accepts")
    limit = min(MAX_ENTRY_BYTES, budget)  # an entry of unknown size decodes this far at most
    try:
        if method == "lz4":
            return lz4_block_decompress(stored, size, limit), ""
        zstd = _zstd_decompressor()
        if zstd is None:
            return None, ("zstd-compressed; install the 'zstandard' package to read it, or "
                          "build with --compress none")
        out = zstd(stored, size or limit)
        if not size and len(out) > limit:
            raise ValueError(f"decodes to more than the {limit} bytes left of kjit's budget")
        if size and len(out) != size:
            raise ValueError(f"decodes to {'more' if len(out) > size else len(out)} bytes, "
                             f"not the {size} its header declares")
        return out, ""
    except (ValueError, IndexError) as exc:
        raise ContainerFormatError(f"corrupt {method} entry in fatbin: {exc}") from None
    except Exception as exc:  # the zstd libraries' own error types
        raise ContainerFormatError(f"corrupt {method} entry in fatbin: {exc}") from None


def _zstd_decompressor():
    """decompress(data, limit): at most limit + 1 bytes of output, whatever the frame claims."""
    try:  # Python 3.14+
        from compression import zstd as _z  # type: ignore[import-not-found]
        return lambda data, limit: _z.ZstdDecompressor().decompress(data, max_length=limit + 1)
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]

        def via_zstandard(data: bytes, limit: int) -> bytes:
            out = bytearray()  # in chunks: read(n) would allocate n bytes at once
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                while len(out) <= limit:
                    chunk = reader.read(min(1 << 20, limit + 1 - len(out)))
                    if not chunk:
                        break
                    out += chunk
            return bytes(out)
        return via_zstandard
    except ImportError:
        pass
    try:
        import pyzstd  # type: ignore[import-not-found]
        return lambda data, limit: pyzstd.ZstdDecompressor().decompress(data, max_length=limit + 1)
    except ImportError:
        return None


# --- writing, with nvFatbin --------------------------------------------------------------

# nvFatbin's -compress-mode values. kjit's default is "none": every entry then stays
# readable by kjit itself (inspect, PTX version checks in the loader) with no zstd
# library; "balance" is nvcc's default (PTX compressed), "size" compresses everything.
COMPRESS_MODES = ("none", "speed", "balance", "size")
# Entries are added in this order (then by arch), so the same inputs give the same bytes
# whatever order they were handed over in.
_KIND_ORDER = {"cubin": 0, "ptx": 1, "ltoir": 2}


class FatbinError(KjitError):
    """nvFatbin rejected an input or could not produce the fatbin."""


@dataclass(frozen=True)
class FatbinInput:
    """One entry to write: kind (cubin, ptx, ltoir), arch (sm_90, sm_90a, compute_90), bytes."""

    kind: str
    arch: str
    code: bytes
    name: str = "kjit"
    options: str = ""   # JIT options stored with PTX / LTO-IR

    def sort_key(self) -> tuple:
        a = arch_mod.parse(self.arch)
        return (_KIND_ORDER[self.kind], a.number, a.suffix, self.name, self.code)


def _as_input(item: Any) -> FatbinInput:
    if isinstance(item, FatbinInput):
        inp = item
    elif all(hasattr(item, a) for a in ("kind", "arch", "code", "name")):   # an ObjectCode
        kind = "cubin" if item.kind == "object" else item.kind
        if item.arch is None:
            raise InvalidOptionError(f"{item.name}: {item.kind} has no architecture recorded; "
                                     "pass a FatbinInput with arch=")
        inp = FatbinInput(kind, item.arch, item.code, item.name)
    else:
        raise InvalidOptionError(f"fatbin inputs are ObjectCode or FatbinInput, got {type(item).__name__}")
    if inp.kind not in _KIND_ORDER:
        raise InvalidOptionError(
            f"{inp.name}: a fatbin holds cubin, ptx or ltoir entries, not {inp.kind!r} "
            "(HIP code objects go into an offload bundle: kjit build --backend hip)")
    a = arch_mod.parse(inp.arch)
    if inp.kind == "ptx" and not a.virtual:
        inp = FatbinInput(inp.kind, a.compute, inp.code, inp.name, inp.options)
    return inp


def _arch_arg(arch: str) -> str:
    """nvFatbin wants the XX of sm_XX / compute_XX, with the a/f suffix: '90', '90a', '100f'."""
    a = arch_mod.parse(arch)
    return f"{a.number}{a.suffix}"


def write_fatbin(items: Iterable[Any], *, compress: str = "none") -> bytes:
    """The fatbin bytes holding every item (FatbinInput or ObjectCode), in a canonical order.
    Raises FatbinError naming the entry nvFatbin rejected, InvalidOptionError for inputs that
    cannot go into a fatbin."""
    from ..families import load_family_library
    load_family_library("nvfatbin")
    from cuda.bindings import nvfatbin

    if compress not in COMPRESS_MODES:
        raise InvalidOptionError(f"compress={compress!r} is not one of {', '.join(COMPRESS_MODES)}")
    inputs = sorted((_as_input(i) for i in items), key=FatbinInput.sort_key)
    if not inputs:
        raise InvalidOptionError("a fatbin needs at least one cubin, PTX or LTO-IR entry")
    seen: dict[tuple[str, str], str] = {}
    for inp in inputs:
        if (inp.kind, inp.arch) in seen and seen[(inp.kind, inp.arch)] != inp.name:
            raise InvalidOptionError(
                f"two {inp.kind} entries for {inp.arch} ({seen[(inp.kind, inp.arch)]} and "
                f"{inp.name}): the driver would load only one; link them into one first")
        seen[(inp.kind, inp.arch)] = inp.name
    options = ["-64", f"-compress-mode={compress}"]
    if compress == "none":
        options.append("-compress=false")
    try:
        handle = nvfatbin.create(options, len(options))
    except nvfatbin.nvFatbinError as exc:
        raise FatbinError(f"nvFatbinCreate({' '.join(options)}) failed: {exc}") from None
    except Exception as exc:   # libnvfatbin not found (cuda.pathfinder's error, an OSError)
        from ..families import family_install_hint
        raise FatbinError(f"nvFatbin is not installed: {family_install_hint()} "
                          f"[{type(exc).__name__}: {str(exc).strip()}]") from None
    try:
        for inp in inputs:
            what = f"{inp.kind} for {inp.arch} ({inp.name}, {len(inp.code)} bytes)"
            try:
                if inp.kind == "cubin":
                    nvfatbin.add_cubin(handle, inp.code, len(inp.code), _arch_arg(inp.arch), inp.name)
                elif inp.kind == "ptx":
                    nvfatbin.add_ptx(handle, inp.code, len(inp.code), _arch_arg(inp.arch),
                                     inp.name, inp.options)
                else:
                    nvfatbin.add_ltoir(handle, inp.code, len(inp.code), _arch_arg(inp.arch),
                                       inp.name, inp.options)
            except nvfatbin.nvFatbinError as exc:
                raise FatbinError(f"nvFatbin rejected the {what}: {exc}") from None
        size = nvfatbin.size(handle)
        buf = bytearray(size)
        nvfatbin.get(handle, buf)
    except nvfatbin.nvFatbinError as exc:
        raise FatbinError(f"nvFatbin could not finish the fatbin: {exc}") from None
    finally:
        nvfatbin.destroy(handle)
    return bytes(buf)
