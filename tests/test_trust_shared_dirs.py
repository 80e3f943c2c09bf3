"""Nothing in a cache directory that another user owns or can write is trusted (issue 40):
a group member of a group-writable cache directory planted `toolkit-headers.json` naming
its own headers, or rewrote `nvrtc-facts.json`, and another user's compiles followed it.

The tests run as whoever runs the suite; "another user" and "a group with other members"
are a uid and a gid that no account here has (chown needs root, so those tests skip
without it)."""
from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest

from kjit.cache import trust
from kjit.compiler import facts, toolkit_headers

OTHER_UID = OTHER_GID = 54321   # no account's: a group with members other than the owner

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="chown to another uid or gid needs root")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(d))
    facts.nvrtc.cache_clear()
    getattr(facts, "_refused", set()).clear()
    yield d
    facts.nvrtc.cache_clear()


def _group_writable(d: Path) -> None:
    os.chown(d, -1, OTHER_GID)
    os.chmod(d, 0o770)


def _plant_facts(d: Path) -> None:
    (d / facts.FILE_NAME).write_text(json.dumps({facts._wheel(): {"version": [1, 0], "archs": [1]}}))


def _planted_headers(tmp_path: Path, d: Path) -> str:
    """A toolkit-headers.json in `d` naming directories of the planter's, valid in shape."""
    evil = tmp_path / "evil"
    (evil / "cuda" / "std").mkdir(parents=True)
    (evil / "cuda" / "std" / "version").write_text("")
    (evil / "cuda_runtime.h").write_text("")
    (d / toolkit_headers.RECORD_FILE).write_text(json.dumps(
        {toolkit_headers._identity(): {"cccl": str(evil), "cudart": str(evil)}}))
    return str(evil)


def _real_facts() -> dict:
    facts.nvrtc.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = facts.nvrtc()
    return {"facts": got, "warnings": [str(w.message) for w in seen]}


needs_wheel = pytest.mark.skipif(facts._wheel() is None, reason="facts are kept only for an NVRTC wheel")


@needs_root
@needs_wheel
def test_facts_in_a_group_writable_directory_are_not_read(cache):
    _plant_facts(cache)
    _group_writable(cache)
    got = _real_facts()["facts"]
    assert got["archs"] != [1] and 90 in got["archs"]   # NVRTC asked, the plant ignored
    assert json.loads((cache / facts.FILE_NAME).read_text())[facts._wheel()]["archs"] == [1]  # not rewritten


@needs_root
@needs_wheel
def test_a_facts_file_of_another_user_is_not_read_and_is_named(cache):
    _plant_facts(cache)
    os.chown(cache / facts.FILE_NAME, OTHER_UID, -1)
    got = _real_facts()
    assert got["facts"]["archs"] != [1]
    assert any(facts.FILE_NAME in w and "belongs to another user" in w for w in got["warnings"]), got


@needs_root
@needs_wheel
def test_a_group_writable_facts_file_counts_only_where_the_group_can_reach_it(cache):
    _plant_facts(cache)
    path = cache / facts.FILE_NAME
    os.chown(path, -1, OTHER_GID)
    os.chmod(path, 0o664)
    # the directory is 0700: no one but its owner reaches the file, whatever its mode
    assert _real_facts()["facts"]["archs"] == [1]
    _plant_facts(cache)   # as planted, again: the first call rewrote nothing
    os.chown(cache, -1, OTHER_GID)
    os.chmod(cache, 0o750)   # the group may enter, and can write the file
    got = _real_facts()
    assert got["facts"]["archs"] != [1]
    assert any("writable by the group" in w and "chmod g-w" in w for w in got["warnings"]), got


@needs_root
def test_a_planted_headers_list_in_a_group_writable_directory_is_not_followed(cache, tmp_path):
    evil = _planted_headers(tmp_path, cache)
    _group_writable(cache)
    found = toolkit_headers._pathfinder_remembered()
    assert evil not in found.values()


@needs_root
def test_a_headers_list_of_another_user_is_not_followed(cache, tmp_path):
    evil = _planted_headers(tmp_path, cache)
    os.chown(cache / toolkit_headers.RECORD_FILE, OTHER_UID, -1)
    with pytest.warns(RuntimeWarning, match="belongs to another user"):
        found = toolkit_headers._pathfinder_remembered()
    assert evil not in found.values()


def test_a_headers_list_of_ones_own_is_followed(cache, tmp_path):
    """The check refuses what others could write, not the owner's own record."""
    evil = _planted_headers(tmp_path, cache)
    assert toolkit_headers._pathfinder_remembered() == {"cccl": evil, "cudart": evil}


@needs_root
def test_a_group_writable_cache_directory_is_not_used(cache):
    import kjit
    from kjit.cache import lookup
    _group_writable(cache)
    lookup._caches.clear()
    try:
        with pytest.warns(Warning, match="writable by the group"):
            kjit.compile('extern "C" __global__ void k(float *x) { x[0] = 2; }', arch="sm_90")
    finally:
        lookup._caches.clear()
    assert not (cache / "entries").exists()
    with pytest.raises(trust.Untrusted, match=r"chmod g-w"):
        trust.check_directory(cache)


@needs_root
def test_a_users_own_private_group_may_write():
    """Where a group is named as its owner and lists no one else (user-private groups, the
    default of Debian and Fedora), its write bit is the owner's own."""
    import grp
    import pwd
    me = pwd.getpwuid(os.geteuid()).pw_name
    try:
        own = grp.getgrnam(me)
    except KeyError:
        pytest.skip(f"no group named {me}")
    if set(own.gr_mem) - {me}:
        pytest.skip(f"the group {me} has other members")
    import tempfile
    d = Path(tempfile.mkdtemp())
    try:
        os.chown(d, -1, own.gr_gid)
        os.chmod(d, 0o770)
        trust.check_directory(d)   # no error
        os.chown(d, -1, OTHER_GID)
        with pytest.raises(trust.Untrusted):
            trust.check_directory(d)
    finally:
        os.rmdir(d)


def test_read_private_refuses_a_fifo_without_waiting(cache):
    (cache / "headers").mkdir(mode=0o700)
    os.mkfifo(cache / "headers" / "x.json")
    with pytest.raises(trust.Untrusted, match="not a regular file"):
        trust.read_private(cache / "headers" / "x.json", 100)


def test_kjits_own_record_files_are_never_group_writable(cache, tmp_path):
    old = os.umask(0o002)   # a umask that leaves the group's write bit on
    try:
        toolkit_headers._pathfinder_remembered()
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(cache / toolkit_headers.RECORD_FILE).st_mode)
    assert not mode & (stat.S_IWGRP | stat.S_IWOTH), oct(mode)
