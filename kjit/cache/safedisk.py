"""diskcache's Disk made safe for a cache directory kjit does not fully trust.

A row kjit did not write (pickled by another program, or planted) must cost a recompile,
never run code or touch a file outside the cache: pickles are refused both ways, and a
value file's name must have the shape diskcache gives it (two hex directories and a hex
name), so a row naming `../../x` is neither read nor deleted.
"""
from __future__ import annotations

import diskcache

from .entry import CorruptEntry
from .valuefiles import checked_value_file, remove_value_file


class SafeDisk(diskcache.Disk):
    """diskcache's Disk that refuses to pickle or unpickle and reads or deletes only value
    files it could have written: a poisoned database row can cost a recompile, never run
    code or reach outside the cache directory."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError("kjit cache keys are strings")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise CorruptEntry("pickled key in the cache database")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if type(value) not in (bytes, str, int, float):
            raise TypeError("kjit cache values are bytes, str or numbers")
        return super().store(value, read, key)

    def fetch(self, mode, filename, value, read):
        if mode == diskcache.core.MODE_PICKLE:
            raise CorruptEntry("pickled value in the cache database")
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY, diskcache.core.MODE_TEXT):
            raise CorruptEntry(f"value of unknown mode {mode!r} in the cache database")
        if mode != diskcache.core.MODE_RAW:
            checked_value_file(self._directory, filename)
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path):
        remove_value_file(self._directory, file_path)
