"""Many processes at once: one compile per new key, everyone gets the right binary, and
different keys do not wait for each other. Workers start with multiprocessing 'spawn'."""
from __future__ import annotations

import multiprocessing as mp
import os
import time


N_PROCS = 32


def _create_counted(log_path: str, delay: float, tag: str):
    from kjit.objectcode import ObjectCode
    with open(log_path, "a") as f:  # O_APPEND: one line per real create, from any process
        f.write(f"{os.getpid()}\n")
    time.sleep(delay)
    ptx = f".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry {tag}()\n{{\nret;\n}}\n"
    return ObjectCode(ptx.encode(), kind="ptx")


def _worker(args):
    cache_dir, log_path, tag, delay, start_at = args
    os.environ["KJIT_CACHE_DIR"] = cache_dir
    import functools
    import kjit.cache
    while time.time() < start_at:  # line everyone up on the same instant
        time.sleep(0.001)
    t0 = time.time()
    obj = kjit.cache.get_or_create("stampede", {"tag": tag},
                                   functools.partial(_create_counted, log_path, delay, tag))
    return obj.cache_hit, obj.code, t0, time.time()


def _compile_worker(args):
    cache_dir, source, start_at = args
    os.environ["KJIT_CACHE_DIR"] = cache_dir
    import kjit
    while time.time() < start_at:
        time.sleep(0.001)
    obj = kjit.compile(source, arch="sm_90")
    return obj.cache_hit, obj.code


def test_32_processes_create_a_new_entry_once(tmp_path):
    log = tmp_path / "creates.log"
    ctx = mp.get_context("spawn")
    with ctx.Pool(N_PROCS) as pool:
        pool.map(abs, range(N_PROCS))  # start every interpreter before the clock starts
        start = time.time() + 1.0
        results = pool.map(_worker, [(str(tmp_path / "c"), str(log), "k", 0.5, start)] * N_PROCS)
    assert len(log.read_text().split()) == 1, "the same key was created more than once"
    assert sorted(r[0] for r in results) == [False] + [True] * (N_PROCS - 1)
    assert len({r[1] for r in results}) == 1 and b".entry k()" in results[0][1]


def test_32_processes_compiling_the_same_new_kernel(tmp_path, saxpy_src):
    ctx = mp.get_context("spawn")
    src = saxpy_src + f"\n// unique {time.time()}\n"
    with ctx.Pool(N_PROCS) as pool:
        pool.map(abs, range(N_PROCS))
        start = time.time() + 1.0
        results = pool.map(_compile_worker, [(str(tmp_path / "c"), src, start)] * N_PROCS)
    assert [r[0] for r in results].count(False) == 1
    assert len({r[1] for r in results}) == 1 and results[0][1].startswith(b"\x7fELF")


def test_different_keys_do_not_block_each_other(tmp_path):
    log = tmp_path / "creates.log"
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(abs, range(2))
        start = time.time() + 0.5
        slow = pool.apply_async(_worker, ((str(tmp_path / "c"), str(log), "slow", 3.0, start),))
        fast = pool.apply_async(_worker, ((str(tmp_path / "c"), str(log), "fast", 0.0, start),))
        f_hit, _, f_t0, f_t1 = fast.get(timeout=60)
        s_hit, _, s_t0, s_t1 = slow.get(timeout=60)
    assert (f_hit, s_hit) == (False, False)
    assert f_t1 - f_t0 < 2.0, "a different key waited for the slow one's lock"
    assert s_t1 - s_t0 >= 3.0


def test_a_waiting_process_reports_its_wait(tmp_path, monkeypatch):
    """The listener tells a benchmark that a hit came from waiting on another process."""
    import functools
    import kjit.cache
    from kjit.cache import lookup
    log = tmp_path / "creates.log"
    ctx = mp.get_context("spawn")
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "c"))
    with ctx.Pool(1) as pool:
        pool.map(abs, range(1))
        start = time.time() + 0.5
        other = pool.apply_async(_worker, ((str(tmp_path / "c"), str(log), "w", 2.0, start),))
        while not log.exists():
            time.sleep(0.01)
        events = []
        kjit.cache.add_listener(events.append)
        try:
            obj = kjit.cache.get_or_create("stampede", {"tag": "w"},
                                           functools.partial(_create_counted, str(log), 0, "w"))
        finally:
            kjit.cache.remove_listener(events.append)
        other.get(timeout=60)
    assert obj.cache_hit is True and events[-1].event == "disk_hit" and events[-1].wait_s > 0.5
    assert len(log.read_text().split()) == 1
