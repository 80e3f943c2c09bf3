"""Whether a cache directory may be used, and opening lock files in it without following links.

Entries are checksummed, but a checksum is no signature: whoever can write the directory
can plant a cubin under any key (or a headers list naming its own directory). So kjit uses
a cache directory, and reads a file in it, only when it belongs to the user running kjit
(or to root, for a cache baked into an image) and no other user can write it: not every
user, and not a group with other members (a group of the owner's own, as systems with
user-private groups make, is the owner). Inside a directory that only its owner can enter,
a group's write bit reaches no one. kjit never follows a symbolic link planted where it
creates a file.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

SUBDIRS = ("entries", "usage", "locks", "headers", "sources", "pch", "native")


class Untrusted(OSError):
    """The directory belongs to someone else or others can write it."""


def check_directory(path: Path) -> None:
    """Raise Untrusted if `path` (an existing directory) or kjit's subdirectories in it
    belong to another user (root excepted) or are writable by others; also if a
    subdirectory is a symbolic link. POSIX only: elsewhere there is nothing to check."""
    if not hasattr(os, "geteuid"):
        return
    check_owner(path)
    top = os.stat(path)
    for name in SUBDIRS:
        try:
            st = os.lstat(path / name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise Untrusted(errno.EPERM, f"{path / name} is a symbolic link; kjit does not follow "
                            "links inside its cache directory: remove it")
        _check(path / name, st, "cache subdirectory", top)


def check_owner(path: Path) -> None:
    """Raise Untrusted if the directory `path` belongs to another user (root excepted) or
    is writable by others."""
    if hasattr(os, "geteuid"):
        _check(path, os.stat(path), "cache directory")


def _check(path: Path, st: os.stat_result, what: str, parent: os.stat_result | None = None) -> None:
    """Untrusted unless `st` (of `path`, inside the directory whose stat is `parent`, if
    given) belongs to this user or root and no other user can write it."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise Untrusted(errno.EPERM, f"the {what} {path} belongs to another user (uid {st.st_uid}); "
                        "kjit uses only a cache directory you (or root) own, and only files you "
                        "(or root) wrote in it: set KJIT_CACHE_DIR to your own directory")
    if st.st_mode & stat.S_IWOTH:
        raise Untrusted(errno.EPERM, f"the {what} {path} is writable by every user (mode "
                        f"{stat.S_IMODE(st.st_mode):o}), so anyone could plant code in it: "
                        f"`chmod o-w {path}` or set KJIT_CACHE_DIR to a private directory")
    if (st.st_mode & stat.S_IWGRP and (parent is None or parent.st_mode & stat.S_IXGRP)
            and not _owners_own_group(st)):
        raise Untrusted(errno.EPERM, f"the {what} {path} is writable by the group "
                        f"{_group_name(st.st_gid)} (mode {stat.S_IMODE(st.st_mode):o}), so its other "
                        f"members could plant code in it: `chmod g-w {path}` or set KJIT_CACHE_DIR "
                        "to a private directory")


def _group_name(gid: int) -> str:
    try:
        import grp
        return f"{grp.getgrgid(gid).gr_name!r} (gid {gid})"
    except (ImportError, KeyError):
        return f"gid {gid}"


def _owners_own_group(st: os.stat_result) -> bool:
    """Whether the file's group is its owner's user-private group: named as the owner, and
    listing no one else (Debian's and Fedora's default for every user)."""
    try:
        import grp
        import pwd
        owner = pwd.getpwuid(st.st_uid).pw_name
        group = grp.getgrgid(st.st_gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == owner and set(group.gr_mem) <= {owner}


def trusted(path: Path) -> bool:
    """True if kjit may read what the cache directory `path` holds (check_directory passes,
    or it does not exist yet)."""
    try:
        check_directory(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def read_private(path: Path, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of a file kjit wrote in its cache directory, never through a
    symbolic link; Untrusted if the file or the directory holding it belongs to another
    user (root excepted) or is writable by others."""
    parent = None
    if hasattr(os, "geteuid"):
        parent = os.lstat(path.parent)
        if stat.S_ISLNK(parent.st_mode):
            raise Untrusted(errno.EPERM, f"{path.parent} is a symbolic link")
        _check(path.parent, parent, "cache directory", os.stat(path.parent.parent))
    # O_NONBLOCK: a FIFO planted under the name is opened without waiting for a writer
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(errno.EPERM, f"{path} is not a regular file: remove it")
        if hasattr(os, "geteuid"):
            _check(path, st, "cache file", parent)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_lock(directory: Path, name: str) -> int:
    """A file descriptor for `directory/name`, created if absent, never through a symbolic
    link (one planted there is removed and the file made afresh)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
    try:
        try:
            return os.open(name, flags, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return os.open(name, flags | os.O_EXCL, 0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def remove_cache_files(path: Path) -> None:
    """Delete kjit's databases and lock files under `path`, whatever state they are in.
    A symbolic link there is removed itself, never followed (shutil.rmtree does not
    follow links inside the trees it removes)."""
    import shutil
    for name in SUBDIRS:
        p = path / name
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p)
        else:
            os.unlink(p)
