"""The progress bar kjit draws while a batch runs: `kjit build`'s compiles, kjit.compile_many's
items, the autotuner's candidates.

One bar (click's) on stderr, so it never mixes with output on stdout; by default only when
stderr is a terminal, and never for a batch too small to wait on. It may appear only once
the batch has run a while, and may be advanced from any thread (compile_many's replies
arrive on its serving threads). Imports nothing of kjit, so every layer that runs batches
can draw it; click is imported only when a bar is drawn.
"""
from __future__ import annotations

import sys
import threading
from typing import Any


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):   # no stderr (None under pythonw) or a closed one
        return False


class Bar:
    """`total` steps under `label`. show: None draws on a terminal only, True on stderr
    whatever it is, False never; a batch of fewer than `min_total` steps draws nothing.
    after_s > 0: the bar appears only once the batch has run that long, so a quick batch
    (all cache hits) stays quiet. Use as a context manager, or start() and close()."""

    def __init__(self, total: int, label: str, *, show: bool | None = None, min_total: int = 2,
                 after_s: float = 0.0, show_pos: bool = False):
        self.total, self.label, self.after_s, self.show_pos = total, label, after_s, show_pos
        self.count = 0
        self.wanted = (show is not False and total >= min_total
                       and (show is True or stderr_is_terminal()))
        self._lock = threading.Lock()
        self._bar: Any = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def __enter__(self) -> "Bar":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        if not self.wanted:
            return
        if self.after_s > 0:
            self._timer = threading.Timer(self.after_s, self._draw)
            self._timer.daemon = True
            self._timer.start()
        else:
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            if self._bar is None and not self._closed and self.count < self.total:
                import click
                self._bar = click.progressbar(length=self.total, label=self.label,
                                              file=sys.stderr, show_pos=self.show_pos)
                self._bar.__enter__()
                if self.count:   # steps done before it appeared
                    self._bar.update(self.count)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.count += n
            if self._bar is not None:
                self._bar.update(n)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._bar is not None:
                self._bar.__exit__(None, None, None)
                self._bar = None
