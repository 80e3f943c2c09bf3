"""LZ4 block decoding: the format fatbins use for `-compress-mode=speed` entries.

The bytes are untrusted: decoding stops at the declared size, never holds more, and a
block that decodes to more or fewer bytes is corrupt.
"""
from __future__ import annotations

from ..errors import InvalidOptionError

# LZ4 cannot expand more than 255 bytes of output per input byte (a run of 255-valued
# length bytes), so a larger claim is corrupt before anything is decoded.
LZ4_MAX_RATIO = 255


class LZ4FormatError(InvalidOptionError):
    """An LZ4 block is corrupt or does not decode to its declared size."""


def _lz4_length(src: bytes, i: int, length: int, cap: int) -> tuple[int, int]:
    """A literal or match length: a nibble of 15 continues in bytes until one is not 255."""
    if length == 15:
        while True:
            if i >= len(src):
                raise LZ4FormatError("LZ4 block ends inside a length")
            b = src[i]
            i += 1
            length += b
            if b != 255:
                break
            if length > cap:
                raise LZ4FormatError(f"a length runs past the {cap} bytes still to decode")
    return length, i


def lz4_block_decompress(src: bytes, size: int, max_size: int = 1 << 30) -> bytes:
    """Decode one LZ4 block whose declared uncompressed size is `size` (0: unknown, then at
    most LZ4_MAX_RATIO bytes per input byte and max_size in all). LZ4FormatError (a
    KjitError and a ValueError) says what is wrong."""
    n = len(src)
    if size > LZ4_MAX_RATIO * n + 16:
        raise LZ4FormatError(f"{n} compressed bytes cannot decode to the {size} declared")
    cap = size or min(LZ4_MAX_RATIO * n + 16, max_size)
    out = bytearray()
    i = 0
    while i < n:
        token = src[i]
        i += 1
        lit, i = _lz4_length(src, i, token >> 4, cap - len(out))
        if lit > cap - len(out) or i + lit > n:
            raise LZ4FormatError(f"literals at offset {i} run past the "
                                 f"{'declared size' if lit > cap - len(out) else 'input'}")
        out += src[i:i + lit]
        i += lit
        if i >= n or (size and len(out) == size):
            break  # the last sequence has literals only
        if i + 2 > n:
            raise LZ4FormatError("block ends inside a match offset")
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(out):
            raise LZ4FormatError(f"LZ4 match offset {offset} points before the start")
        mlen, i = _lz4_length(src, i, token & 15, cap - len(out))
        mlen += 4
        if mlen > cap - len(out):
            raise LZ4FormatError(f"a match at offset {i} runs past the declared {size} bytes" if size
                                 else f"a match at offset {i} expands past {cap} bytes")
        # The match may overlap what it produces: it then repeats the last `offset` bytes.
        chunk = bytes(out[len(out) - offset:len(out) - offset + min(offset, mlen)])
        reps, rest = divmod(mlen, len(chunk))
        out += chunk * reps + chunk[:rest]
    if size and (len(out) != size or src[i:].strip(b"\0")):
        raise LZ4FormatError(f"decodes to {len(out)} bytes{' and more' if len(out) == size else ''}, "
                             f"not the {size} its header declares")
    return bytes(out)
