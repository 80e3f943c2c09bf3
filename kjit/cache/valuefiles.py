"""diskcache's value files (values too large for a database row), named and removed safely:
a file's name must have the shape diskcache gives it (two hex directories and a hex name), so
a row planted in the database cannot make kjit read or delete a file elsewhere."""
from __future__ import annotations

import contextlib
import os
import re

from .entry import CorruptEntry

VALUE_FILE_RE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")


def checked_value_file(directory: str, filename: str) -> str:
    """The full path of a value file named by a row; CorruptEntry if the name is foreign."""
    if not isinstance(filename, str) or not VALUE_FILE_RE.fullmatch(filename):
        raise CorruptEntry(f"value file name {str(filename)[:40]!r} is not one kjit writes")
    return os.path.join(directory, filename)


def remove_value_file(directory: str, filename: str | None) -> None:
    """Delete a value file (and its emptied directories) if its name is one diskcache makes."""
    if not filename:
        return
    try:
        path = checked_value_file(directory, filename)
    except CorruptEntry:
        return
    with contextlib.suppress(OSError):
        os.remove(path)
    parent = os.path.dirname(path)
    for _ in range(2):  # the two hex directories, never the database directory itself
        with contextlib.suppress(OSError):
            os.rmdir(parent)
        parent = os.path.dirname(parent)
