"""The compile observer's parts on their own: the C recorder hooked into a small library built
here (every hooked call, errno kept, other threads and other libraries unseen), and the
sorting of records into what a compile read, probed and found absent."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading

import pytest

from kjit.compiler.keys import observe

_observe = pytest.importorskip("kjit.compiler.keys._observe", reason="the compile observer is not built")

PROBE_C = r'''
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
int probe_fopen(const char *p) { FILE *f = fopen(p, "r"); int e = errno; if (f) fclose(f); return f ? 0 : e; }
int probe_fopen_w(const char *p) { FILE *f = fopen(p, "w"); if (f) fclose(f); return f ? 0 : errno; }
int probe_open(const char *p) { int fd = open(p, O_RDONLY); int e = errno; if (fd >= 0) close(fd); return fd >= 0 ? 0 : e; }
int probe_stat(const char *p) { struct stat st; return stat(p, &st) == 0 ? 0 : errno; }
int probe_lstat(const char *p) { struct stat st; return lstat(p, &st) == 0 ? 0 : errno; }
int probe_access(const char *p) { return access(p, R_OK) == 0 ? 0 : errno; }
int probe_realpath(const char *p) { char buf[PATH_MAX]; return realpath(p, buf) ? 0 : errno; }
int probe_opendir(const char *p) { DIR *d = opendir(p); int e = errno; if (d) closedir(d); return d ? 0 : e; }
int probe_openat(int dirfd, const char *p) { int fd = openat(dirfd, p, O_RDONLY); int e = errno; if (fd >= 0) close(fd); return fd >= 0 ? 0 : e; }
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the probe library")
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.c").write_text(PROBE_C)
    lib = d / "libkjitprobe.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(d / "probe.c")], check=True)
    handle = ctypes.CDLL(str(lib))
    patched = dict(_observe.install(["libkjitprobe"]))
    assert patched[str(lib)] == 8  # fopen open openat stat lstat access realpath opendir
    return handle


def record(fn):
    _observe.start()
    try:
        result = fn()
    finally:
        recs = _observe.stop()
    return result, [(op, kind, path) for op, kind, path, *_ in recs]


def test_every_hooked_call_is_recorded_with_what_it_found(probe, tmp_path):
    f = tmp_path / "a.h"
    f.write_text("x")
    gone = tmp_path / "nope.h"
    b = lambda p: str(p).encode()  # noqa: E731
    calls = [(probe.probe_fopen, f, ("o", 1)), (probe.probe_fopen, gone, ("o", 0)),
             (probe.probe_open, f, ("o", 1)), (probe.probe_stat, gone, ("s", 0)),
             (probe.probe_stat, tmp_path, ("s", 2)), (probe.probe_lstat, f, ("l", 1)),
             (probe.probe_access, f, ("a", 1)), (probe.probe_realpath, gone, ("r", 0)),
             (probe.probe_opendir, tmp_path, ("d", 2)), (probe.probe_fopen_w, tmp_path / "out", ("o", 5))]
    for fn, path, (op, kind) in calls:
        result, recs = record(lambda: fn(b(path)))
        assert (op, kind, str(path)) in recs, (fn, recs)
        assert result == (0 if kind else 2)            # the caller still sees errno (ENOENT = 2)


def test_openat_names_the_path_through_its_directory(probe, tmp_path):
    (tmp_path / "x.h").write_text("x")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        _, recs = record(lambda: probe.probe_openat(fd, b"x.h"))
    finally:
        os.close(fd)
    assert ("o", 1, str(tmp_path / "x.h")) in recs


def test_only_the_recording_thread_and_hooked_libraries_are_seen(probe, tmp_path):
    f = str(tmp_path / "t.h").encode()
    out: list = []

    def other():
        out.append(probe.probe_stat(f))
    _observe.start()
    t = threading.Thread(target=other)
    t.start()
    t.join()
    os.stat(tmp_path)                                    # Python's own call: not hooked
    recs = _observe.stop()
    assert recs == [] and out == [2]
    assert not _observe.recording()
    with pytest.raises(RuntimeError):
        _observe.stop()


def rec(op, kind, path, sig=(1, 2, 3, 4, 5)):
    return (op, kind, path, *sig)


def test_classify_sorts_reads_probes_and_absent_paths(tmp_path):
    d = os.getcwd()  # a relative source name: NVRTC probes next to it, in the current directory
    records = [
        rec("s", 0, f"{d}/k.cu"), rec("s", 0, f"{d}/__nv_name_map"),          # NVRTC's own probes
        rec("s", 0, "/inc1/a.h"), rec("o", 0, "/inc1/a.h"),                    # absent
        rec("s", 1, "/inc2/a.h"), rec("o", 1, "/inc2/a.h"),                    # read
        rec("s", 1, "/inc2/probe.h"),                                          # found, not opened
        rec("o", 2, "/inc2/dir.h"),                                            # a directory: may become a file
        rec("s", 4, "/locked/a.h"),                                            # EACCES: absent for now
        rec("o", 5, "/tmp/kjit-scratch-x/out.o"), rec("o", 1, "/tmp/kjit-scratch-x/out.o"),
        rec("o", 1, "/proc/self/maps"), rec("s", 2, "/inc2"), rec("R", 3, "/inc2/a.h"),
        rec("o", 1, "/pch/k.pch"),
    ]
    obs = observe.classify(records, source_name="k.cu", ignore=("/pch",))
    assert obs.complete and not obs.cwd_dependent
    assert list(obs.read) == ["/inc2/a.h"] and list(obs.probed) == ["/inc2/probe.h"]
    assert obs.absent == ["/inc1/a.h", "/inc2/dir.h", "/locked/a.h"]


def test_classify_refuses_what_it_cannot_trust(tmp_path):
    assert not observe.classify(None).complete                # the recorder ran out of memory
    assert not observe.classify([]).complete                  # nothing seen: not observed
    changed = [rec("o", 1, "/i/a.h"), rec("o", 1, "/i/a.h", (1, 2, 9, 9, 9))]
    assert not observe.classify(changed).complete             # opened twice, different files
    flicker = [rec("s", 0, "/i/a.h"), rec("o", 1, "/i/a.h")]
    assert not observe.classify(flicker).complete             # absent, then there
    rel = observe.classify([rec("s", 0, "lib/x")])
    assert rel.cwd_dependent and rel.absent == [os.path.join(os.getcwd(), "lib/x")]
    here = observe.classify([rec("o", 1, os.path.join(os.getcwd(), "a.h"))])
    assert here.cwd_dependent
