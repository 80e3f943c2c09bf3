"""A fresh process's cold compile: what it leaves on disk is a valid cache for the next
process, however it ends (a normal exit that skips SQLite's checkpoint, a kill -9 right after
a store), including a cache read later from read-only storage."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kjit.cache.tables import Table

ROOT = Path(__file__).resolve().parent.parent
SRC = 'extern "C" __global__ void k3(float* out, int n, float a) { out[0] = n + a; }'


def _python(code: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KJIT_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def _verify_and_hit(cache: Path) -> None:
    """Another fresh process finds the entry, and every entry passes its checks."""
    out = _python(f"import json, kjit, kjit.cache as c\n"
                  f"hit = kjit.compile({SRC!r}, arch='sm_90').cache_hit\n"
                  f"print(json.dumps([hit, c.verify()]))", cache)
    assert out.returncode == 0, out.stderr
    hit, report = json.loads(out.stdout)
    assert hit is True
    assert report["checked"] == report["ok"] == 1 and not report["corrupt"], report
    with sqlite3.connect(cache / "entries" / "cache.db") as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _verify_entries(cache: Path, n: int) -> None:
    out = _python("import json, kjit.cache as c\nprint(json.dumps(c.verify()))", cache)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["checked"] == report["ok"] == n and not report["corrupt"], report


def test_a_cold_compile_leaves_a_cache_the_next_process_reads(tmp_path):
    cache = tmp_path / "cache"
    out = _python(f"import kjit\nassert kjit.compile({SRC!r}, arch='sm_90').cache_hit is False", cache)
    assert out.returncode == 0, out.stderr
    if sys.version_info >= (3, 12):   # Connection.setconfig: the exit skipped the checkpoint
        assert (cache / "entries" / "cache.db-wal").stat().st_size > 0
    _verify_and_hit(cache)


def test_kill_9_right_after_a_store_leaves_a_valid_cache(tmp_path):
    cache = tmp_path / "cache"
    out = _python(f"import os, signal, kjit\n"
                  f"assert kjit.compile({SRC!r}, arch='sm_90').cache_hit is False\n"
                  f"os.kill(os.getpid(), signal.SIGKILL)", cache)
    assert out.returncode == -9, out.stderr
    _verify_and_hit(cache)


def test_a_read_only_reader_sees_what_is_only_in_the_write_ahead_log(tmp_path):
    """A cache baked into an image right after a process wrote it (its log not checkpointed)
    is read in full from read-only storage."""
    cache = tmp_path / "cache"
    out = _python(f"import os, signal, kjit\n"
                  f"assert kjit.compile({SRC!r}, arch='sm_90').cache_hit is False\n"
                  f"os.kill(os.getpid(), signal.SIGKILL)", cache)   # nothing checkpoints the log
    assert out.returncode == -9, out.stderr
    assert (cache / "entries" / "cache.db-wal").stat().st_size > 0
    table = Table.open(cache / "entries", immutable=True)
    try:
        assert len(table.keys()) == 1
    finally:
        table.close()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Connection.setconfig is Python 3.12+")
def test_the_log_left_at_exit_stays_short(tmp_path):
    """Commits still checkpoint a log past WAL_PAGES, so the next opener reads little."""
    from kjit.cache.tables import WAL_PAGES
    cache = tmp_path / "cache"
    out = _python("import os\n"
                  "from kjit.cache.disk import DiskStore\n"
                  "from kjit.objectcode import ObjectCode\n"
                  "from pathlib import Path\nstore = DiskStore(Path(os.environ['KJIT_CACHE_DIR']))\n"
                  "for i in range(60):\n"
                  "    store.put(f'k{i}', ObjectCode(b'x' * 3000, kind='ptx', name='k'), {})\n", cache)
    assert out.returncode == 0, out.stderr
    wal = cache / "entries" / "cache.db-wal"
    assert wal.stat().st_size > 0   # left at exit
    assert wal.stat().st_size <= (WAL_PAGES + 40) * (4096 + 24) + 32
    _verify_entries(cache, 60)


# --- the device's arch: cuInit on a helper thread, overlapping the imports -----------------
DEVICE_ARCH = r'''
import sys, kjit
from kjit import driver, errors
src = 'extern "C" __global__ void f(int* p) { p[0] = 42; }'
try:
    obj = kjit.compile(src)
except errors.InvalidOptionError as exc:
    print("no arch:", exc)
else:
    print("arch", obj.arch)
t = driver._starting   # it may go on to make the device's context: that ends too
if t is not None:
    t.join(60)
print("cuInit helper", t is not None and not t.is_alive())
if sys.argv[1] == "gpu":
    major, minor = driver.compute_capability(driver.thread_device())
    assert obj.arch == f"sm_{major}{minor}", obj.arch
    assert driver._initialized
'''


def _device_arch(tmp_path, mode: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"), **env,
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", DEVICE_ARCH, mode], env=full, capture_output=True,
                          text=True, timeout=300)


def test_device_arch_without_a_driver_is_the_same_error_or_kjit_arch(tmp_path):
    from kjit import driver
    if driver.available():
        pytest.skip("a CUDA driver is here: the GPU test covers this machine")
    out = _device_arch(tmp_path, "cpu")
    assert out.returncode == 0, out.stderr
    assert "no arch: no architecture given and none can be detected" in out.stdout
    assert "cuInit helper True" in out.stdout   # started, finished, nothing left running
    out = _device_arch(tmp_path, "cpu", KJIT_ARCH="sm_90")
    assert out.returncode == 0, out.stderr
    assert "arch sm_90" in out.stdout and "cuInit helper True" in out.stdout


def test_start_init_without_a_driver_keeps_init_s_error():
    from kjit import driver
    if driver.available():
        pytest.skip("a CUDA driver is here")
    code = ("from kjit import driver, errors\n"
            "driver.start_init()\n"
            "try:\n    driver.init()\nexcept errors.CudaUnavailableError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))))
    assert out.returncode == 0 and out.stdout.startswith("no CUDA driver found"), out


@pytest.mark.gpu
def test_device_arch_comes_from_a_cuinit_started_in_the_background(tmp_path):
    out = _device_arch(tmp_path, "gpu")
    assert out.returncode == 0, out.stderr
    assert "cuInit helper True" in out.stdout and "arch sm_" in out.stdout, out.stdout


class _FakeLibcuda:
    """libcuda's calls the cuInit helper makes, with `initialized` saying whether another
    library ran cuInit first."""

    def __init__(self, initialized: bool):
        self.initialized, self.retained = initialized, []

    def cuDeviceGetCount(self, count):
        if not self.initialized:
            return 3   # CUDA_ERROR_NOT_INITIALIZED
        count._obj.value = 2
        return 0

    def cuInit(self, flags):
        self.initialized = True
        return 0

    def cuDeviceGet(self, dev, ordinal):
        dev._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        self.retained.append(dev.value)
        ctx._obj.value = 0x1000 + dev.value
        return 0


@pytest.mark.parametrize("initialized, context", [(False, True), (True, True), (False, False)])
def test_the_cuinit_helper_makes_the_default_device_s_context_only_after_the_first_cuinit(
        monkeypatch, initialized, context):
    """After the process's first cuInit no context is current anywhere, so the calling
    thread's device is its default one and its context starts at once; after another
    library's cuInit the calling thread may have a context current: nothing is made. A
    compile for a given arch (context=False) only runs cuInit."""
    import threading
    from kjit import driver
    fake = _FakeLibcuda(initialized)
    monkeypatch.setattr(driver, "libcuda_ctypes", lambda: fake)
    for name, value in (("_starting", None), ("_started", threading.Event()), ("_warming", {}),
                        ("_warm_retained", {}), ("_primary", {}), ("_initialized", False),
                        ("_unavailable", None)):
        monkeypatch.setattr(driver, name, value)
    previous = driver.set_default_device(1)
    try:
        driver.start_init(context=context)
        assert driver._started.wait(10)
        driver._starting.join(10)
    finally:
        driver.set_default_device(previous)
    assert fake.initialized
    if initialized or not context:
        assert fake.retained == [] and driver._warming == {}
    else:
        assert fake.retained == [1] and driver._warm_retained == {1: 1}
        assert driver._warming[1] is driver._starting   # warm_primary_context(1) waits for it
        assert not driver.making_context()


def test_a_compile_that_must_run_nvrtc_starts_cuinit_in_the_background(tmp_path, monkeypatch):
    """NVRTC's first compile calls cuInit where a driver is installed: a compile that cannot
    hit (no cache directory yet, or cache=False) starts it first, and a miss as soon as its
    lookup fails, before NVRTC loads; never with a context. A hit starts nothing (it needs no
    driver)."""
    import kjit
    from kjit import driver
    from kjit.cache import lookup
    started = []
    monkeypatch.setattr(driver, "start_init", lambda context=True: started.append(context))
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "new"))
    assert kjit.compile(SRC, arch="sm_90").cache_hit is False
    assert started and not any(started)
    started.clear()
    lookup._caches.clear()   # a disk hit, as in a new process
    assert kjit.compile(SRC, arch="sm_90").cache_hit is True
    assert started == []
    assert kjit.compile(SRC + " ", arch="sm_90").cache_hit is False   # a miss: the directory exists
    assert started == [False]
    started.clear()
    assert kjit.compile(SRC, arch="sm_90", cache=False).cache_hit is None
    assert started and not any(started)
