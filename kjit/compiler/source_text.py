"""Source text a compiler can take whole: UTF-8, with no NUL byte.

NVRTC reads a source as a C string, so a NUL byte ends it there and everything after is
silently dropped: the compile "succeeds" without the rest of the file. Non-UTF-8 bytes
cannot become the str kjit.compile takes. Both are refused here with the file name and
the byte offset (and line) of the first bad byte.
"""
from __future__ import annotations

import os

from ..errors import InvalidOptionError


def _where(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    return f"byte offset {offset} (line {line})"


def decode(data: bytes, name: str) -> str:
    """`data` as text; InvalidOptionError naming `name` and the offset of a bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidOptionError(
            f"{name}: not UTF-8 text: byte 0x{data[exc.start]:02x} at {_where(data, exc.start)} "
            "cannot be decoded; save the file as UTF-8") from None
    check(text, name, data)
    return text


def check(text: str, name: str, data: bytes | None = None) -> None:
    """InvalidOptionError if `text` holds a NUL, which would cut the source short, or a lone
    surrogate, which no compiler can be given (UTF-8 cannot encode it)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            line = text.count("\n", 0, exc.start) + 1
            column = exc.start - text.rfind("\n", 0, exc.start)
            raise InvalidOptionError(
                f"{name}: line {line}, column {column} holds U+{ord(text[exc.start]):04X}, a lone "
                "surrogate that is not text (a file read with errors='surrogateescape' keeps its "
                "bytes that are not UTF-8 this way): read it as UTF-8, or pass its bytes to "
                "kjit.compile, which says where they are not UTF-8") from None
    if "\0" not in text:
        return
    data = data if data is not None else text.encode("utf-8", "surrogatepass")
    offset = data.find(b"\0")
    raise InvalidOptionError(
        f"{name}: NUL byte at {_where(data, offset)}: the compiler would silently ignore "
        "everything after it; remove it (is this a binary file?)")


def read(path: str | os.PathLike[str]) -> str:
    """The text of a source file, checked as above: a regular file of at most
    fileio.MAX_SOURCE_BYTES (a device or FIFO is refused by name, never read)."""
    from ..fileio import MAX_SOURCE_BYTES, read_input
    return decode(read_input(path, MAX_SOURCE_BYTES, "source"), os.fspath(path))
