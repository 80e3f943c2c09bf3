"""Writing an output file the way compilers do.

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


def temporary_beside(real: str) -> tuple[int, str]:
    """A new file next to `real`: created exclusively (never through a planted link) with
    mode 0666 less the umask, as the final file would get from open()."""
    directory, name = os.path.split(real)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")  # secrets imports base64
        try:
            return os.open(tmp, flags, 0o666), tmp
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


def replace_with(path: str | os.PathLike[str], data: bytes) -> None:
    """Put `data` at `path`, one of kjit's own files (in the cache directory): written to a
    new file beside it (never through a planted link) and renamed over it, so a reader sees
    the old file or the new one, and a link at `path` is replaced, not followed."""
    fd, tmp = temporary_beside(os.fspath(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
