"""`kjit cache export` and `import`: cache entries in one zip file.

An archive comes from another machine and is not trusted: every entry's checksum and key
are checked before it is stored, and the sizes in the zip's central directory are checked
before anything is inflated (no entry over MAX_ENTRY_BYTES or the cache's size limit, no
archive inflating to more than twice that limit). Members are then read in chunks and
never past their declared size, so a zip bomb costs neither memory nor time.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from . import entry as entry_mod
from .disk import Unavailable
from ..errors import InvalidOptionError, KjitError

EXPORT_FORMAT = "kjit-cache-export/1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 16
MAX_ENTRY_BYTES = 256 << 20     # far above any cubin NVRTC makes; an entry is held whole
_KEY_RE = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def export(store: Any, file: str | Path, keys: list[str]) -> dict[str, Any]:
    """Write the entries under `keys` to `file` ("-": standard output) as one zip."""
    from .key import SCHEMA_VERSION
    n, skipped = 0, []
    try:
        with _output(file) as out:
            with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
                for k in keys:
                    try:
                        blob = store.get_blob(k)
                        if blob is None:
                            continue
                        entry_mod.decode_header(blob, k)  # never export a corrupt entry
                    except entry_mod.CorruptEntry as exc:
                        skipped.append({"key": k, "error": str(exc)})
                        continue
                    z.writestr(f"entries/{k}", blob)
                    n += 1
                z.writestr(MANIFEST, json.dumps({"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION,
                                                 "entries": n, "created": time.time()}))
            size = out.tell() if out.seekable() else None
    except OSError as exc:
        raise KjitError(f"cannot write {file}: {exc.strerror or exc}") from None
    return {"file": str(file), "exported": n, "skipped": skipped, "bytes": size}


@contextlib.contextmanager
def _output(file: str | Path) -> Iterator[BinaryIO]:
    """fileio.open_output(file), or standard output for "-"."""
    if str(file) == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    from ..fileio import open_output
    with open_output(file) as f:
        yield f


def import_(store: Any, file: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Add the entries of an export archive to `store`; see the module's checks."""
    from ..fileio import check_input
    file = Path(file)
    check_input(file, None, "cache export")   # a device or FIFO is no zip (and could hang)
    try:
        z = zipfile.ZipFile(file)
    except Exception as exc:  # zipfile raises many kinds on a damaged archive
        raise InvalidOptionError(f"{file} is not a kjit cache export: {exc or type(exc).__name__}") from None
    imported, present, rejected = 0, 0, []
    with z:
        _read_manifest(z, file)
        members = _check_sizes(z, file, store.size_limit)
        for info in members:
            name = info.filename.removeprefix("entries/")
            if not _KEY_RE.fullmatch(name):
                rejected.append({"key": info.filename, "error": "not a cache key"})
                continue
            if not overwrite and store.contains(name):
                present += 1
                continue
            try:
                store.put_blob(name, _read(z, info))
                imported += 1
            except (entry_mod.CorruptEntry, ValueError) as exc:
                rejected.append({"key": name, "error": str(exc)})
            except Unavailable as exc:
                raise KjitError(f"cannot write to the kjit cache: {exc}") from None
    return {"file": str(file), "imported": imported, "already_present": present, "rejected": rejected}


def _read_manifest(z: zipfile.ZipFile, file: Path) -> dict[str, Any]:
    try:
        info = z.getinfo(MANIFEST)
    except KeyError:
        raise InvalidOptionError(f"{file} is not a kjit cache export (no {MANIFEST})") from None
    if info.file_size > MAX_MANIFEST_BYTES:
        raise InvalidOptionError(f"{file}: {MANIFEST} declares {info.file_size} bytes; a kjit "
                                 "manifest is a few hundred")
    try:
        manifest = json.loads(_read(z, info))
    except (ValueError, RecursionError) as exc:
        raise InvalidOptionError(f"{file}: {MANIFEST} cannot be read ({exc})") from None
    if not isinstance(manifest, dict):
        raise InvalidOptionError(f"{file}: {MANIFEST} is a JSON {type(manifest).__name__}, not an "
                                 "object: not a kjit cache export")
    if manifest.get("format") != EXPORT_FORMAT:
        raise InvalidOptionError(f"{file}: unknown export format {str(manifest.get('format'))[:60]!r} "
                                 f"(this kjit reads {EXPORT_FORMAT})")
    return manifest


def _check_sizes(z: zipfile.ZipFile, file: Path, size_limit: int) -> list[zipfile.ZipInfo]:
    """The entry members, after refusing an archive whose declared sizes are too large."""
    members = [i for i in z.infolist() if i.filename != MANIFEST and not i.filename.endswith("/")]
    per_entry = min(MAX_ENTRY_BYTES, size_limit)
    for info in members:
        if info.file_size > per_entry:
            raise InvalidOptionError(
                f"{file}: member {info.filename[:80]!r} inflates to {info.file_size} bytes, more "
                f"than any cache entry may hold ({per_entry} bytes: the smaller of "
                f"{MAX_ENTRY_BYTES} and KJIT_CACHE_SIZE); not importing it")
    total = sum(i.file_size for i in members)
    if total > 2 * size_limit:
        raise InvalidOptionError(
            f"{file} inflates to {total} bytes, more than twice the cache's size limit "
            f"({size_limit} bytes): raise KJIT_CACHE_SIZE to import it")
    return members


def _read(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, read in chunks and never past its declared size; ValueError if
    the member cannot be read."""
    out = bytearray()
    try:
        with z.open(info) as f:
            while len(out) <= info.file_size:
                chunk = f.read(min(_CHUNK, info.file_size + 1 - len(out)))
                if not chunk:
                    break
                out += chunk
    except Exception as exc:  # zlib.error, BadZipFile, EOFError, an unsupported method...
        raise ValueError(f"member cannot be read: {exc or type(exc).__name__}") from None
    if len(out) != info.file_size:
        raise ValueError(f"member inflates to {'more' if len(out) > info.file_size else 'less'} "
                         f"than its declared {info.file_size} bytes")
    return bytes(out)
