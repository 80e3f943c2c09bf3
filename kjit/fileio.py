"""Reading an input whole, bounded; writing an output file the way compilers do.

Inputs (read_input, check_input): only a regular file is read, and only up to a limit,
so a device (/dev/zero, /dev/urandom), a FIFO without a writer, a socket or a huge or
sparse file is refused by name instead of filling memory or hanging. A FIFO is never
opened (it would block until a writer came); the file is checked again on the open
descriptor, so one swapped in after the check is caught too.

Outputs:

- A regular file, or a name that does not exist yet, is written to a new temporary file
  beside it and renamed over it: a reader never sees half a file, and a failed write
  leaves the old file as it was.
- A symbolic link is followed: its target is written and the link stays.
- Anything else that exists (/dev/null, /dev/full, a FIFO, a terminal) is opened and
  written through; it is never created, truncated, renamed over or replaced.
- A directory or a socket is an error.
Write errors (ENOSPC on /dev/full, a closed pipe) are raised as OSError.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import BinaryIO, Iterator

from .errors import InvalidOptionError

# What kjit reads whole, at most (docs/security.md). Far above any real input of each kind,
# far below what would exhaust a machine.
MAX_SOURCE_BYTES = 64 << 20     # a source file: the largest generated CUDA sources are a few MiB
MAX_BINARY_BYTES = 1 << 30      # a cubin, fatbin, PTX, LTO-IR or object file to inspect or link
MAX_SIDECAR_BYTES = 16 << 20    # a .kjit.json sidecar beside a saved binary
_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _checked(path: str | os.PathLike[str], st: os.stat_result, limit: int | None, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InvalidOptionError(
            f"cannot read {what} {os.fsdecode(path)}: it is {_kind(st.st_mode)}, not a regular "
            f"file; kjit reads a {what} only from a regular file (a device or pipe could be "
            "endless or never answer): save it to a file and pass that")
    if limit is not None and st.st_size > limit:
        raise InvalidOptionError(
            f"cannot read {what} {os.fsdecode(path)}: it is {st.st_size} bytes "
            f"({_size(st.st_size)}), more than kjit reads for a {what} ({limit} bytes, "
            f"{_size(limit)}): is it the file you meant?")


def check_input(path: str | os.PathLike[str], limit: int | None, what: str = "input") -> os.stat_result:
    """The stat of `path` if it is a regular file of at most `limit` bytes (None: any size);
    InvalidOptionError naming it otherwise. For a file another part of kjit opens itself."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:   # ValueError: a NUL in the name
        raise InvalidOptionError(f"cannot read {what} {os.fsdecode(path)}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
    _checked(path, st, limit, what)
    return st


def read_input(path: str | os.PathLike[str], limit: int, what: str = "input") -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; InvalidOptionError
    naming `path` for anything else (see the module's rules), never a hang."""
    check_input(path, limit, what)   # a FIFO is refused before open() could block on it
    flags = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InvalidOptionError(f"cannot read {what} {os.fsdecode(path)}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        _checked(path, st, limit, what)   # what was opened, whatever the name now is
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
            # One allocation of the size fstat gives; then at most to the limit, for a file
            # that grows while it is read.
            chunks = [f.read(st.st_size + 1)]
            total = len(chunks[0])
            while total <= limit and total > st.st_size:
                chunk = f.read(min(_CHUNK, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except OSError as exc:
        raise InvalidOptionError(f"cannot read {what} {os.fsdecode(path)}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise InvalidOptionError(f"cannot read {what} {os.fsdecode(path)}: it grew past "
                                 f"{limit} bytes ({_size(limit)}) while kjit read it")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def destination(path: str | os.PathLike[str]) -> tuple[str, bool]:
    """(the path that will be written, whether it is a special file written through)."""
    real = os.path.realpath(path)  # a symlink's target, even a dangling one
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, False
    if stat.S_ISREG(st.st_mode):
        return real, False
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", os.fspath(path))
    if stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EINVAL, "is a socket", os.fspath(path))
    return real, True


@contextlib.contextmanager
def open_output(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A binary file to write `path` through; the result lands there when the block ends
    without an exception (see the module's rules)."""
    real, special = destination(path)
    if special:
        # No O_CREAT and no O_TRUNC: a device node or FIFO is written, never made or replaced.
        fd = os.open(real, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "wb") as f:
            yield f
        return
    fd, tmp = temporary_beside(real)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(real)
            if not stat.S_ISREG(st.st_mode):  # it became something else meanwhile
                raise OSError(errno.EEXIST, "is no longer a regular file; not replacing it", real)
            os.chmod(tmp, stat.S_IMODE(st.st_mode))  # keep the old file's permissions
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temporary_beside(real: str, mode: int = 0o666) -> tuple[int, str]:
    """A new file next to `real`: created exclusively (never through a planted link) with
    `mode` less the umask (by default what the final file would get from open())."""
    directory, name = os.path.split(real)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")  # secrets imports base64
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise OSError(errno.EEXIST, "no free temporary file name", directory)


def write_file(path: str | os.PathLike[str], data: bytes) -> bool:
    """Write `data` to `path` (see the module's rules); returns whether `path` is a special
    file that was written through (nothing can be placed beside it)."""
    special = destination(path)[1]
    with open_output(path) as f:
        f.write(data)
    return special


def replace_with(path: str | os.PathLike[str], data: bytes, mode: int = 0o666) -> None:
    """Put `data` at `path`, one of kjit's own files (in the cache directory): written to a
    new file beside it (never through a planted link) and renamed over it, so a reader sees
    the old file or the new one, and a link at `path` is replaced, not followed. `mode`
    (less the umask): 0o644 for a file kjit later trusts only if no one else can write it."""
    fd, tmp = temporary_beside(os.fspath(path), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
