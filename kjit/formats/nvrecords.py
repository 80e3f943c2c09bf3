""".nv.info records: (format u8, attribute u8, value), read in one pass.

EIFMT_NVAL has no value, BVAL a byte, HVAL a u16, SVAL a u16 length and that many bytes;
every record is 4-byte aligned. Apart from kjit.formats.nvinfo (which turns the records into
per-kernel resources) so that the ELF reader can tell kernels from device functions.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOptionError

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4

EIATTR = {
    0x04: "CTAIDZ_USED", 0x05: "MAX_THREADS", 0x0A: "PARAM_CBANK", 0x0F: "EXTERNS",
    0x10: "REQNTID", 0x11: "FRAME_SIZE", 0x12: "MIN_STACK_SIZE", 0x17: "KPARAM_INFO",
    0x19: "CBANK_PARAM_SIZE", 0x1B: "MAXREG_COUNT", 0x1C: "EXIT_INSTR_OFFSETS",
    0x23: "MAX_STACK_SIZE", 0x2F: "REGCOUNT", 0x37: "CUDA_API_VERSION", 0x4C: "NUM_BARRIERS",
}
# Global .nv.info records that are (symbol index u32, value u32) pairs.
PER_SYMBOL_CODES = (0x2F, 0x11, 0x12, 0x23)  # REGCOUNT, FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE


@dataclass(frozen=True)
class Attribute:
    format: int
    code: int
    value: Any            # None, int (BVAL/HVAL) or bytes (SVAL)

    @property
    def name(self) -> str:
        return EIATTR.get(self.code, f"0x{self.code:02x}")

    def u32s(self) -> tuple[int, ...]:
        raw = self.value if isinstance(self.value, bytes) else b""
        return struct.unpack_from(f"<{len(raw) // 4}I", raw)


class NvInfoFormatError(InvalidOptionError):
    """A .nv.info section holds a record that is cut short or too short for its attribute."""


# Attributes only kernels carry (the parameter constant bank); device functions have none.
_KERNEL_ONLY = (0x0A, 0x17, 0x19)
_VALUE_SIZE = {EIFMT_NVAL: 0, EIFMT_BVAL: 1, EIFMT_HVAL: 2}


def parse_nvinfo(data: bytes) -> list[Attribute]:
    """The records of one .nv.info section, in one pass. A record that runs past the end of
    the section (a cut-short BVAL/HVAL/SVAL) or has an unknown format raises
    NvInfoFormatError: the section is malformed, and what follows it cannot be trusted."""
    out: list[Attribute] = []
    off, n_data = 0, len(data)
    while off + 2 <= n_data:
        fmt, code = data[off], data[off + 1]
        name = EIATTR.get(code, f"0x{code:02x}")
        if fmt == EIFMT_SVAL:
            if off + 4 > n_data:
                raise NvInfoFormatError(f"truncated .nv.info: the {name} record at offset "
                                        f"{off} ends before its length")
            (n,) = struct.unpack_from("<H", data, off + 2)
            if off + 4 + n > n_data:
                raise NvInfoFormatError(f"truncated .nv.info: the {name} record at offset {off} "
                                        f"declares {n} bytes; {n_data - off - 4} remain")
            out.append(Attribute(fmt, code, bytes(data[off + 4:off + 4 + n])))
            off += 4 + n
        elif fmt in _VALUE_SIZE:
            width = _VALUE_SIZE[fmt]
            if off + 2 + width > n_data:
                raise NvInfoFormatError(f"truncated .nv.info: the {name} record at offset {off}"
                                        f" has a {width}-byte value past the section's end")
            value = None if fmt == EIFMT_NVAL else (
                data[off + 2] if fmt == EIFMT_BVAL else struct.unpack_from("<H", data, off + 2)[0])
            out.append(Attribute(fmt, code, value))
            off += 4
        else:
            raise NvInfoFormatError(f"unknown .nv.info record format {fmt} at offset {off}")
    return out


def has_kernel_attributes(data: bytes) -> bool:
    """Whether a .nv.info.<function> section describes a kernel (it has a parameter bank)."""
    try:
        return any(a.code in _KERNEL_ONLY for a in parse_nvinfo(data))
    except NvInfoFormatError:
        return False
