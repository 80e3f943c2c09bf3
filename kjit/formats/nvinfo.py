"""Per-kernel resource usage read from a cubin's ELF sections, without a GPU.

Where each figure lives (checked against `cuobjdump --dump-resource-usage` and, on the GPU
machine, cuFuncGetAttribute):
- registers: the EIATTR_REGCOUNT record for the kernel's symbol in the global `.nv.info`
  section. Older cubins instead keep it in bits 24..31 of `.text.<kernel>`'s sh_info; that
  is the fallback (NVRTC 13 cubins leave those bits 0).
- shared: the size of `.nv.shared.<kernel>` (static __shared__ data). From sm_90 on, ptxas
  puts the 1 KiB the system reserves per block at the start of that section, so the
  kernel's own static shared memory is the section size less 1 KiB there.
- local: EIATTR_FRAME_SIZE, the per-thread stack frame: local arrays and register spills.
  (How much of it is spills is not recorded in the cubin; ptxas -v prints that.)
- max threads: EIATTR_MAX_THREADS (from __launch_bounds__) or EIATTR_REQNTID.
- parameters: EIATTR_CBANK_PARAM_SIZE, and EIATTR_KPARAM_INFO for each parameter.

`.nv.info` records are (format u8, attribute u8, value): EIFMT_NVAL has no value, BVAL a
byte, HVAL a u16, SVAL a u16 length and that many bytes; every record is 4-byte aligned.
A record cut short by the end of its section, or a per-symbol record (REGCOUNT, FRAME_SIZE,
...) shorter than its 8 bytes, makes the section malformed: NvInfoFormatError says which
record, rather than a figure read from the wrong bytes.
"""
from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from .elf import ElfFile, ElfFormatError
from .nvrecords import EIATTR, Attribute, NvInfoFormatError, parse_nvinfo  # noqa: F401 (re-exported)
from ..errors import InvalidOptionError

# Shared memory that sm_90+ cubins place at the start of every kernel's shared window.
SYSTEM_RESERVED_SHARED = 1024


@dataclass(frozen=True)
class ParamInfo:
    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class KernelResources:
    """What one kernel of a cubin uses. Byte counts; None where the cubin does not say."""

    name: str
    arch: str
    registers: int | None
    shared_bytes: int                 # static shared memory of the kernel (driver's SHARED_SIZE_BYTES)
    shared_section_bytes: int         # raw .nv.shared.<kernel> size (cuobjdump's SHARED)
    local_bytes: int                  # per-thread local memory: frame (local arrays + spills)
    stack_bytes: int                  # minimum stack size (cuobjdump's STACK)
    const_bytes: int                  # .nv.constant0.<kernel> (cuobjdump's CONSTANT[0])
    param_bytes: int | None
    max_threads: int | None           # product of __launch_bounds__/reqntid dims
    max_threads_dims: tuple[int, ...] | None = None
    reqntid: tuple[int, ...] | None = None
    max_registers: int | None = None  # the cap ptxas worked under (EIATTR_MAXREG_COUNT)
    barriers: int | None = None
    params: tuple[ParamInfo, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["params"] = [asdict(p) for p in self.params]
        for k in ("max_threads_dims", "reqntid"):
            d[k] = list(d[k]) if d[k] is not None else None
        return d


# Global .nv.info attributes that are (symbol index u32, value u32) pairs.
_PER_SYMBOL = ("REGCOUNT", "FRAME_SIZE", "MIN_STACK_SIZE", "MAX_STACK_SIZE")
def _int(attr: Attribute | None) -> int | None:
    """A BVAL/HVAL attribute's number; None where it is absent or has another format."""
    return attr.value if attr is not None and isinstance(attr.value, int) else None


def kernel_resources(cubin: bytes) -> list[KernelResources]:
    """Resource usage of every kernel in a cubin, sorted by name."""
    try:
        elf = ElfFile(cubin)
    except ElfFormatError as exc:
        raise InvalidOptionError(f"not a cubin: {exc}") from None
    arch = f"sm_{elf.cuda_sm}"
    sections = {s.name: s for s in elf.sections}
    symbols = elf.symbols

    # Global .nv.info: per-function records keyed by symbol index.
    per_symbol: dict[str, dict[str, int]] = {}
    if ".nv.info" in sections:
        for attr in parse_nvinfo(elf.section_bytes(sections[".nv.info"])):
            if attr.name in _PER_SYMBOL:
                pair = attr.u32s()
                if len(pair) < 2:
                    raise NvInfoFormatError(
                        f"malformed .nv.info: a {attr.name} record holds "
                        f"{len(attr.value) if isinstance(attr.value, bytes) else 0} bytes; it needs "
                        "8 (a symbol index and a value)")
                sym_index, value = pair[:2]
                if sym_index < len(symbols):
                    per_symbol.setdefault(symbols[sym_index].name, {})[attr.name] = value

    reserved = SYSTEM_RESERVED_SHARED if elf.cuda_sm >= 90 else 0
    parsed: dict[tuple[int, int], list[Attribute]] = {}
    out = []
    for name in elf.cuda_kernels():
        glob = per_symbol.get(name, {})
        sec = sections.get(f".nv.info.{name}")
        attrs = []
        if sec is not None:  # sections naming the same bytes are parsed once
            span = (sec.offset, sec.size)
            if span not in parsed:
                parsed[span] = parse_nvinfo(elf.section_bytes(sec))
            attrs = parsed[span]
        first = {}
        for a in attrs:
            first.setdefault(a.name, a)
        registers = glob.get("REGCOUNT")
        text = sections.get(f".text.{name}")
        if registers is None and text is not None and text.info >> 24:
            registers = text.info >> 24
        shared_sec = sections.get(f".nv.shared.{name}")
        shared_raw = shared_sec.size if shared_sec is not None else 0
        barriers = _int(first.get("NUM_BARRIERS"))
        # CUDA 12's ptxas keeps the count in the code section's flags (bits 20..24) instead
        if barriers is None and text is not None and (text.flags >> 20) & 0x1F:
            barriers = (text.flags >> 20) & 0x1F
        const = sections.get(f".nv.constant0.{name}")
        # At most three dimensions: a crafted record must not make a product of thousands.
        dims = first["MAX_THREADS"].u32s()[:3] if "MAX_THREADS" in first else None
        reqntid = first["REQNTID"].u32s()[:3] if "REQNTID" in first else None
        bound = dims or reqntid
        max_threads = None
        if bound:
            max_threads = 1
            for d in bound:
                max_threads *= max(d, 1)
        params = []
        for a in attrs:
            if a.name == "KPARAM_INFO" and isinstance(a.value, bytes) and len(a.value) >= 12:
                _index, ordinal, offset, packed = struct.unpack_from("<IHHI", a.value)
                params.append(ParamInfo(ordinal, offset, (packed >> 18) & 0x3FFF))
        out.append(KernelResources(
            name=name, arch=arch, registers=registers,
            shared_bytes=max(shared_raw - reserved, 0), shared_section_bytes=shared_raw,
            local_bytes=glob.get("FRAME_SIZE", 0), stack_bytes=glob.get("MIN_STACK_SIZE", 0),
            const_bytes=const.size if const is not None else 0,
            param_bytes=_int(first.get("CBANK_PARAM_SIZE")),
            max_threads=max_threads, max_threads_dims=tuple(dims) if dims else None,
            reqntid=tuple(reqntid) if reqntid else None,
            max_registers=_int(first.get("MAXREG_COUNT")), barriers=barriers,
            params=tuple(sorted(params, key=lambda p: p.ordinal))))
    return out
