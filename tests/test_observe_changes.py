"""Exact by observation, over time: one long-lived process through rename-saves, retargeted
symlinks and swapped directories; headers edited while the compiler runs; cache directories
kjit must not read. Each test checks the constant in the PTX. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import kjit
from kjit.compiler import cached as compiled
from kjit.compiler.keys import observe, snapshot
from observe_helpers import KERNEL, ptx, settle, val, write

pytestmark = pytest.mark.skipif(not observe.available(), reason="the compile observer is not built")

REAL_TICK = snapshot.timestamp_granularity  # taken before conftest's fixture replaces it


@pytest.fixture
def real_tick(monkeypatch):
    """The file system's real timestamp tick (conftest takes it as zero for other tests)."""
    monkeypatch.setattr(snapshot, "timestamp_granularity", REAL_TICK)


# --- 6. one long-lived process: change notification follows what the path names now ------------
@pytest.fixture
def notified(monkeypatch):
    """Repeats trust inotify from the first one (no stat check in between)."""
    from kjit.compiler.keys import watch
    if not sys.platform.startswith("linux"):
        pytest.skip("change notification is Linux-only")
    monkeypatch.setattr(compiled, "STAT_CHECKS_BEFORE_WATCHING", 0)
    assert watch._inotify() is not None


def edit_in_place(path: Path, text: str) -> None:
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()
    settle()


def repeat(src: str, opts: dict, times: int = 2) -> list[int]:
    return [val(ptx(src, **opts)) for _ in range(times)]


def test_rename_save_with_a_backup_then_in_place_edits(tmp_path, notified):
    """Editors save by writing a new file and renaming it over the old, keeping the old inode
    as a backup: the watch must move to the new inode."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert repeat(src, opts) == [1111111, 1111111]
    os.link(header, inc / "a.h~")                               # the backup keeps the old inode
    write(inc / "a.h.tmp", "#define VAL 2222222\n")
    os.replace(inc / "a.h.tmp", header)
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(header, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(header, "#define VAL 4444444\n")
    assert repeat(src, opts) == [4444444, 4444444]


def test_retargeted_header_symlink_then_in_place_edits(tmp_path, notified):
    inc = tmp_path / "inc"
    one = write(inc / "v1.h", "#define VAL 1111111\n")
    two = write(inc / "v2.h", "#define VAL 2222222\n")
    (inc / "a.h").symlink_to("v1.h")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert repeat(src, opts) == [1111111, 1111111]
    (inc / "tmp").symlink_to("v2.h")
    os.replace(inc / "tmp", inc / "a.h")
    settle()
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(two, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(one, "#define VAL 5555555\n")                 # no longer read: still a hit
    assert ptx(src, **opts).cache_hit is True


def test_swapped_symlinked_include_directory_then_in_place_edits(tmp_path, notified):
    one = write(tmp_path / "one" / "a.h", "#define VAL 1111111\n")
    two = write(tmp_path / "two" / "a.h", "#define VAL 2222222\n")
    link = tmp_path / "inc"
    link.symlink_to(tmp_path / "one")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(link)])
    assert repeat(src, opts) == [1111111, 1111111]
    (tmp_path / "tmp").symlink_to(tmp_path / "two")
    os.replace(tmp_path / "tmp", link)
    settle()
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(two, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(one, "#define VAL 4444444\n")
    assert repeat(src, opts) == [3333333, 3333333]


# --- 7. a header edited while the compiler runs ------------------------------------------------
def test_edit_and_revert_during_the_compile_is_returned_not_stored(tmp_path, monkeypatch, real_tick):
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    real = compiled.compile_uncached

    def compile_while_someone_edits(req, *args):
        obj = real(req, *args)                                 # NVRTC read 1111111
        header.write_text("#define VAL 2222222\n")             # edited after it read ...
        header.write_text("#define VAL 1111111\n")             # ... and put back
        return obj
    monkeypatch.setattr(compiled, "compile_uncached", compile_while_someone_edits)
    before = kjit.cache.stats()["unstorable"]
    first = ptx(src, **opts)
    assert val(first) == 1111111 and first.cache_hit is None   # returned, not stored
    assert kjit.cache.stats()["unstorable"] == before + 1
    monkeypatch.setattr(compiled, "compile_uncached", real)
    settle()
    assert ptx(src, **opts).cache_hit is False                 # compiled again, stored now
    assert ptx(src, **opts).cache_hit is True


def test_header_changed_between_the_read_and_the_key_is_not_stored(tmp_path, monkeypatch, real_tick):
    """The compiler read one content; when kjit hashes the header it holds another: the
    result must not be filed under the other content's key."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    real = compiled.compile_uncached

    def compile_then_edit(req, *args):
        obj = real(req, *args)
        time.sleep(snapshot.timestamp_granularity())
        header.write_text("#define VAL 2222222\n")
        return obj
    monkeypatch.setattr(compiled, "compile_uncached", compile_then_edit)
    assert val(ptx(src, **opts)) == 1111111
    monkeypatch.setattr(compiled, "compile_uncached", real)
    settle()
    got = ptx(src, **opts)
    assert val(got) == 2222222


def test_a_header_dated_in_the_future_is_still_cached(tmp_path):
    """Archives and skewed clocks leave future mtimes: only ctime tells a recent write."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    future = time.time() + 10 * 365 * 86400
    os.utime(header, (future, future))
    settle()
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert ptx(src, **opts).cache_hit is False
    assert ptx(src, **opts).cache_hit is True


def test_a_thread_swapping_a_header_during_compiles_never_leaves_a_wrong_entry(tmp_path, real_tick):
    import threading
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    texts = ["#define VAL 1111111\n", "#define VAL 2222222\n"]
    stop = threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            tmp = inc / "a.h.tmp"
            tmp.write_text(texts[i % 2])
            os.replace(tmp, header)
            i += 1
            time.sleep(0.001)
    t = threading.Thread(target=swap)
    t.start()
    try:
        for i in range(12):
            src = f'#include "a.h"\n// variant {i % 3}\n' + KERNEL
            ptx(src, include_dirs=[str(inc)])
    finally:
        stop.set()
        t.join()
    compiled._memo.clear()
    for text in texts + texts[::-1]:
        write(header, text)
        want = int(text.split()[2])
        for i in range(3):
            src = f'#include "a.h"\n// variant {i}\n' + KERNEL
            assert val(ptx(src, include_dirs=[str(inc)])) == want


# --- 8. nothing is read from a cache directory that fails the trust checks ---------------------
def test_planted_manifest_in_a_world_writable_headers_dir_is_not_read(tmp_path, monkeypatch):
    import json
    import warnings
    from kjit.compiler import include_path
    from kjit.compiler.keys import manifest
    from kjit.compiler.keys.description import manifest_key
    from kjit.compiler.request import make_request
    cache = tmp_path / "cache"
    monkeypatch.setenv("KJIT_CACHE_DIR", str(cache))
    b = kjit.compile(KERNEL.replace("VAL", "2222222"), arch="sm_80", target="ptx")
    b_key = next(iter(manifest_keys(cache)))                  # B's entry and manifest on disk
    a_src = KERNEL.replace("VAL", "1111111")
    req = make_request(a_src, arch="sm_80", target="ptx")
    prekey = manifest_key(req, include_path.for_options(req.options, "cuda"), observed=True)
    payload = json.dumps({"records": [{"key": b_key, "snapshot": snapshot.Snapshot().to_json()}]},
                         separators=(",", ":")).encode()
    planted = cache / "headers" / prekey[:2] / f"{prekey}.json"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(manifest._check_line(payload) + b"\n" + payload)
    os.chmod(cache / "headers", 0o777)                          # anyone could have planted it
    compiled._memo.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = kjit.compile(a_src, arch="sm_80", target="ptx")
    assert val(a) == 1111111 and val(b) == 2222222


def manifest_keys(cache: Path) -> list[str]:
    import json
    out = []
    for f in (cache / "headers").rglob("*.json"):
        out += [r["key"] for r in json.loads(f.read_bytes().split(b"\n", 1)[1])["records"]]
    return out


def test_toolkit_record_and_facts_are_not_read_from_an_untrusted_cache_dir(tmp_path, monkeypatch):
    from kjit.compiler import facts, toolkit_headers
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("KJIT_CACHE_DIR", str(cache))
    assert toolkit_headers._record_path() is not None and facts._path() is not None
    os.chmod(cache, 0o777)
    assert toolkit_headers._record_path() is None and facts._path() is None


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_an_evicted_entry_is_compiled_again_and_stored(tmp_path, backend):
    """The remembered key's entry is gone: the compile runs again and is stored under it, even
    where the compiler now reads fewer files (clang reads /etc/os-release once per process)."""
    if backend == "hip":
        from kjit.compiler import hiprtc
        if not hiprtc.available():
            pytest.skip("no hiprtc library here")
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1111111\n")
    src = '#include "a.h"\n' + KERNEL + f"// {tmp_path.name}\n"
    opts = kjit.CompileOptions(include_dirs=[str(inc)])
    arch = "gfx90a" if backend == "hip" else "sm_80"

    def build():
        return kjit.compile(src, arch=arch, backend=backend, options=opts)
    first = build()
    assert first.cache_hit is False and build().cache_hit is True
    kjit.cache.clear()
    again = build()
    assert again.cache_hit is False and again.code == first.code
    assert build().cache_hit is True
