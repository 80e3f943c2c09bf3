"""Change notification for the headers of remembered compile keys (Linux inotify, through
ctypes), so an in-process repeat of a compile need not stat every header it read.

A CUB kernel reads ~535 headers; statting them all costs ~0.9 ms here, nine times the budget
of an in-process repeat. git's fsmonitor has the same problem and the same answer: ask the
kernel to report changes, and trust a quiet report. `arm(snapshot)` watches every header
file (content writes and metadata, through any path: an inode watch), every directory
holding one or deciding a failed lookup (entries created, deleted or renamed), and every
ancestor directory (moved or deleted, and entries of those whose child on the path is a
symlink, which could be swapped). It is armed *before* the snapshot's stat check, so a
change after that check is always reported. `quiet(token)` then reads the pending events
(one read(2)); if none touched the token's watches, nothing it covers changed.

Used only where reports are complete: Linux, local file systems (a network file system
does not report other machines' writes), within the process that armed it (a forked child
starts again). Anything else, an overflowed event queue or a full watch table, means the
full stat check (Snapshot.check), which is always exact on its own. Not reported, so not
seen until that stat check runs (in a new process, or after any other change): writes
through a shared memory map, and a file system mounted over a directory while the process
runs. Environment variables are not files: an in-process repeat compares those a compile
read as part of the call's signature (compiler/cached.py). KJIT_HEADER_WATCH=0 turns watching
off.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import select
import stat as stat_mod
import struct
import sys
import threading
from typing import Any

from ...settings import switch_on

ENV = "KJIT_HEADER_WATCH"
MAX_WATCHES = 16384

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_MASK_ADD = 0x4000, 0x8000, 0x20000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC

SELF_MASK = IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
FILE_MASK = SELF_MASK | IN_MODIFY
DIR_MASK = SELF_MASK | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO

# statfs f_type of file systems whose every change goes through this kernel.
LOCAL_FS = frozenset({
    0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0x794C7630, 0x2FC12FC1, 0xF2F52010,
    0x858458F6, 0x52654973, 0x3153464A, 0xCA451A4E, 0x73717368, 0xE0F5E1E2,
})  # ext2/3/4 xfs btrfs tmpfs overlay zfs f2fs ramfs reiserfs jfs bcachefs squashfs erofs

_EVENT = struct.Struct("iIII")


class Token:
    """What one armed snapshot depends on: the watcher instance, the event generation it was
    checked at, and its watch descriptors."""

    __slots__ = ("instance", "gen", "wds")

    def __init__(self, instance: int, gen: int, wds: frozenset[int]):
        self.instance, self.gen, self.wds = instance, gen, wds


class _Inotify:
    _ids = itertools.count(1)

    def __init__(self, libc: Any):
        self.libc = libc
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.pid = os.getpid()
        self.instance = next(self._ids)
        self.gen = 0
        self.overflow_gen = 0
        self.keys_of: dict[int, list[tuple[str, int]]] = {}
        self.last_event: dict[int, int] = {}            # wd -> generation of its last event
        self.local_dev: dict[int, bool] = {}
        self.poll = select.poll()
        self.poll.register(self.fd, select.POLLIN)

    def drain(self) -> None:
        if not self.poll.poll(0):  # the usual answer: nothing happened (no exception raised)
            return
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                self.overflow_gen = self.gen = self.gen + 1
                return
            if not buf:
                return
            self.gen += 1
            off = 0
            while off + _EVENT.size <= len(buf):
                wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                off += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self.overflow_gen = self.gen
                    continue
                self.last_event[wd] = self.gen
                if mask & IN_IGNORED:  # the watch is gone (file deleted): re-added on next arm
                    self.keys_of.pop(wd, None)

    def add(self, path: str, mask: int) -> int | None:
        """Watch what `path` names now. Always asked of the kernel, never answered from a
        table by path: after a rename-save, a retargeted symlink or a swapped directory the
        same path names another inode, which needs its own watch (the kernel returns the
        existing descriptor for an inode already watched)."""
        if len(self.keys_of) >= MAX_WATCHES:
            return None
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask | IN_MASK_ADD)
        if wd < 0:
            return None
        keys = self.keys_of.setdefault(wd, [])
        if (path, mask) not in keys:
            keys.append((path, mask))
        return wd

    def local(self, path: str, st: os.stat_result) -> bool:
        ok = self.local_dev.get(st.st_dev)
        if ok is None:
            buf = ctypes.create_string_buffer(512)
            if self.libc.statfs(os.fsencode(path), buf) != 0:
                ok = False
            else:
                ok = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF in LOCAL_FS
            self.local_dev[st.st_dev] = ok
        return ok

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


_lock = threading.Lock()
_state: dict[str, Any] = {"inotify": None, "failed": False}


def _libc() -> Any:
    name = ctypes.util.find_library("c") or "libc.so.6"
    libc = ctypes.CDLL(name, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.statfs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    return libc


def _inotify() -> _Inotify | None:
    ino = _state["inotify"]
    if ino is not None and ino.pid == os.getpid():
        return ino
    if ino is not None:  # a forked child shares the parent's queue: events would be split
        _state["inotify"] = None
    if _state["failed"] or not sys.platform.startswith("linux") \
            or not switch_on(ENV):
        return None
    try:
        ino = _state["inotify"] = _Inotify(_libc())
    except (OSError, AttributeError):
        _state["failed"] = True
        return None
    return ino


def _forget_after_fork() -> None:
    _state["inotify"] = None  # the child must not read the parent's events


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _ancestors(paths: list[str]) -> dict[str, bool]:
    """Every directory above `paths` -> whether its child on the way down is a symlink."""
    out: dict[str, bool] = {}
    for p in paths:
        child = p
        d = os.path.dirname(p)
        while d and d != child:
            link = os.path.islink(child)
            if d in out:
                out[d] = out[d] or link
                if not link:
                    break
            else:
                out[d] = link
            child, d = d, os.path.dirname(d)
    return out


def arm(snapshot: Any) -> Token | None:
    """Watch everything `snapshot` depends on; None where watching cannot be trusted. Arm
    before Snapshot.check(): what the check saw is then the baseline of the reports."""
    with _lock:
        ino = _inotify()
        if ino is None:
            return None
        ino.drain()
        files, dirs = snapshot.paths()
        wds = set()
        holders = {os.path.dirname(f) for f in files} | set(dirs)
        try:
            for d in holders:
                st = os.stat(d)
                if not stat_mod.S_ISDIR(st.st_mode) or not ino.local(d, st):
                    return None
        except OSError:
            return None
        for path, mask in itertools.chain(
                ((f, FILE_MASK) for f in files), ((d, DIR_MASK) for d in holders),
                ((a, DIR_MASK if link else SELF_MASK)
                 for a, link in _ancestors(sorted(holders)).items() if a not in holders)):
            wd = ino.add(path, mask)
            if wd is None:
                return None
            wds.add(wd)
        return Token(ino.instance, ino.gen, frozenset(wds))


def quiet(token: Token) -> bool:
    """True if nothing `token` watches reported a change since it was armed or last quiet."""
    with _lock:
        ino = _state["inotify"]
        if ino is None or ino.instance != token.instance or ino.pid != os.getpid():
            return False
        ino.drain()
        if ino.gen == token.gen:
            return True
        if ino.overflow_gen > token.gen:
            return False
        last = ino.last_event
        for wd in token.wds:
            if last.get(wd, 0) > token.gen:
                return False
        token.gen = ino.gen
        return True


def validate(snapshot: Any, token: Token | None) -> tuple[bool, Token | None]:
    """(still valid, token to keep): the fast report when it is quiet, else arm and run the
    stat check (arming again if the check moved a watched directory)."""
    if token is not None and quiet(token):
        return True, token
    token = arm(snapshot)
    before = set(snapshot.dirs)
    if not snapshot.check():
        return False, None
    if token is not None and set(snapshot.dirs) - before:
        token = arm(snapshot)
        if not snapshot.check():
            return False, None
    return True, token
