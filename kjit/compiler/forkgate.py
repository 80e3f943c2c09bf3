"""The NVRTC compiles in flight in this process, which a fork waits for.

NVRTC holds a lock of its own while it compiles; a child forked during a compile would wait
for it forever at its first compile (the thread that held it is not in the child). So a
fork (os.fork, multiprocessing's "fork" start method) waits, FORK_WAIT_S at most, for the
compiles of the other threads to end, and new ones wait for the fork. A child forked while
one still ran (from inside a compile, or after the wait ran out) refuses to compile with
NVRTC, saying why, rather than hanging.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from ..errors import KjitError

FORK_WAIT_S = 120.0   # the longest a fork waits for a compile in flight


class _Gate:
    """The NVRTC compiles in flight in this process, so that a fork can wait for them: NVRTC
    holds a lock of its own while it compiles, and a child forked then would wait for it
    forever at its first compile."""

    def __init__(self, refuse: str | None = None) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.active: dict[int, int] = {}   # thread -> compiles in flight
        self.forking = False
        self.refuse = refuse
        self.in_flight = 0

    def enter(self) -> None:
        if self.refuse:
            raise KjitError(self.refuse)
        me = threading.get_ident()
        with self.cond:
            while self.forking and me not in self.active:
                self.cond.wait()
            self.active[me] = self.active.get(me, 0) + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self.cond:
            n = self.active.pop(me) - 1
            if n:
                self.active[me] = n
            self.cond.notify_all()

    def before_fork(self) -> None:
        """Hold new compiles back and wait for those of other threads (FORK_WAIT_S at most;
        the forking thread's own cannot end before the fork)."""
        me = threading.get_ident()
        with self.cond:
            self.forking = True
            self.cond.wait_for(lambda: not any(t != me for t in self.active), FORK_WAIT_S)
            self.in_flight = sum(self.active.values())

    def after_fork_in_parent(self) -> None:
        with self.cond:
            self.forking = False
            self.cond.notify_all()


_gate = _Gate()


_gate = _Gate()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Around NVRTC's compile calls: a fork waits until the block is left."""
    gate = _gate
    gate.enter()
    try:
        yield
    finally:
        gate.leave()


def _after_fork_in_child() -> None:
    global _gate
    refuse = None
    if _gate.in_flight:
        refuse = (f"this process was forked (pid {os.getpid()}) while its parent was compiling "
                  "with NVRTC in another thread, and NVRTC's lock stays held in a forked child: "
                  "it cannot compile here. Fork before compiling starts or after it ends, "
                  "compile in the parent, or start processes with multiprocessing's 'spawn' or "
                  "'forkserver' method")
    _gate = _Gate(refuse)


os.register_at_fork(before=lambda: _gate.before_fork(),
                    after_in_parent=lambda: _gate.after_fork_in_parent(),
                    after_in_child=_after_fork_in_child)
