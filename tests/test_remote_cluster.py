"""Many processes on many "nodes" (separate cache directories) sharing one redis-server:
a new kernel is compiled once by NVRTC for all of them, and a compiler that dies while
holding the lease does not leave the others waiting for long."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

from kjit.cache import remote

REPO = Path(__file__).resolve().parents[1]
N_PROCS, N_NODES = 32, 8


def _compile_on_node(args):
    cache_dir, source, start_at = args
    os.environ["KJIT_CACHE_DIR"] = cache_dir
    import hashlib
    import kjit
    import kjit.cache
    events = []
    kjit.cache.add_listener(lambda e: events.append((e.namespace, e.event)))
    while time.time() < start_at:  # line everyone up on the same instant
        time.sleep(0.001)
    obj = kjit.compile(source, arch="sm_90")
    return events, hashlib.sha256(obj.code).hexdigest(), obj.cache_hit


def test_32_processes_on_8_nodes_compile_a_new_kernel_once(remote_env, tmp_path, saxpy_src):
    src = saxpy_src + f"\n// cluster {time.time()}\n"
    ctx = mp.get_context("spawn")  # children inherit KJIT_REMOTE_CACHE from os.environ
    with ctx.Pool(N_PROCS) as pool:
        pool.map(abs, range(N_PROCS))  # every interpreter started before the clock starts
        start = time.time() + 1.5
        results = pool.map(_compile_on_node, [(str(tmp_path / f"node{i % N_NODES}"), src, start)
                                              for i in range(N_PROCS)])
    events = [e for r in results for e in r[0]]
    compiles = events.count(("compile", "miss"))
    assert compiles == 1, f"NVRTC ran {compiles} times: {events}"
    assert len(events) == N_PROCS and {e[1] for e in events} <= {"miss", "remote_hit", "disk_hit"}
    # every other node got it from Redis; processes on the same node may get it from disk
    assert events.count(("compile", "remote_hit")) >= N_NODES - 1
    assert len({r[1] for r in results}) == 1
    assert sorted(r[2] for r in results) == [False] + [True] * (N_PROCS - 1)


# A process that compiles `key` through the cache; its create() logs when it starts and
# then takes `sleep` seconds (the holder is killed during it).
NODE = r'''
import json, os, sys, time
import kjit.cache
from kjit.objectcode import ObjectCode
log, sleep, fail = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "fail"
def create():
    with open(log, "a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    time.sleep(sleep)
    if fail:
        raise RuntimeError("this compile fails")
    ptx = ".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n"
    return ObjectCode(ptx.encode(), kind="ptx")
try:
    obj = kjit.cache.get_or_create("lease-test", {"k": 1}, create)
    print(json.dumps({"hit": obj.cache_hit, "end": time.time()}))
except RuntimeError as exc:
    print(json.dumps({"error": str(exc), "end": time.time()}))
'''


def _start(cache_dir: Path, log: Path, sleep: float, fail: bool = False) -> subprocess.Popen:
    env = dict(os.environ, KJIT_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, "-c", NODE, str(log), str(sleep), "fail" if fail else "ok"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_first_create(log: Path, holder: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while not (log.exists() and log.read_text().strip()):
        assert holder.poll() is None and time.time() < deadline, holder.communicate()
        time.sleep(0.02)


def test_the_lease_holder_killed_while_compiling(remote_env, tmp_path, monkeypatch):
    lease_s = 2.0
    monkeypatch.setenv(remote.ENV_LEASE, f"{lease_s}s")
    log = tmp_path / "creates.log"
    holder = _start(tmp_path / "node-a", log, 60)
    _wait_for_first_create(log, holder)
    waiter = _start(tmp_path / "node-b", log, 0)
    # The holder keeps its lease alive past lease_s while it compiles: the waiter waits.
    time.sleep(2 * lease_s)
    assert waiter.poll() is None, waiter.communicate()
    assert len(log.read_text().splitlines()) == 1, "the waiter compiled while the holder was alive"
    holder.kill()
    killed_at = time.time()
    holder.wait()
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    result = json.loads(out)
    assert result["hit"] is False, "the waiter did not compile it itself"
    assert result["end"] - killed_at < lease_s + 3.0, "the waiter took too long after the holder died"
    assert len(log.read_text().splitlines()) == 2  # two creates: the killed one and the waiter's


def test_a_failed_compile_does_not_make_the_waiters_fail_one_after_another(remote_env, tmp_path):
    """The holder's compile fails (errors are not cached): the waiters on the other nodes
    compile at once, side by side, rather than each taking the lease in turn."""
    log, seconds = tmp_path / "creates.log", 1.5
    holder = _start(tmp_path / "node-a", log, seconds, fail=True)
    _wait_for_first_create(log, holder)
    waiters = [_start(tmp_path / f"node-{i}", log, seconds, fail=True) for i in range(4)]
    out, err = holder.communicate(timeout=60)
    failed_at = json.loads(out)["end"]
    ends = []
    for w in waiters:
        out, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
        result = json.loads(out)
        assert result["error"] == "this compile fails"
        ends.append(result["end"])
    # one after another would take 4 x 1.5 s after the holder failed
    assert max(ends) - failed_at < 2 * seconds + 1.0, [e - failed_at for e in ends]


def _nvrtc_runs_on_node(args):
    """kjit.compile on a fresh "node" (its own cache directory), counting NVRTC's compiles:
    the key of a kernel new to everyone is learnt by compiling it (the observer sees what
    it reads), so that compile is the one the cluster must share."""
    cache_dir, source, start_at = args
    os.environ["KJIT_CACHE_DIR"] = cache_dir
    import hashlib
    import kjit
    from kjit.compiler import nvrtc
    runs = []
    real = nvrtc.compile_source

    def counted(*a, **kw):
        runs.append(1)
        return real(*a, **kw)
    nvrtc.compile_source = counted
    while time.time() < start_at:
        time.sleep(0.001)
    obj = kjit.compile(source, arch="sm_90")
    return len(runs), hashlib.sha256(obj.code).hexdigest()


def test_nodes_starting_a_new_kernel_together_run_nvrtc_once(remote_env, tmp_path, saxpy_src):
    """6 nodes start one kernel no node has compiled, at the same instant: one NVRTC compile
    for the cluster (the others wait on the lease of the kernel's record, then find its key
    and the binary in Redis), every node the same bytes."""
    src = saxpy_src + f"\n// new to the cluster {time.time()}\n"
    nodes = 6
    ctx = mp.get_context("spawn")
    with ctx.Pool(nodes) as pool:
        pool.map(abs, range(nodes))
        start = time.time() + 1.5
        results = pool.map(_nvrtc_runs_on_node,
                           [(str(tmp_path / f"node{i}"), src, start) for i in range(nodes)])
    runs = sum(r[0] for r in results)
    assert runs == 1, f"NVRTC ran {runs} times on {nodes} nodes: {[r[0] for r in results]}"
    assert len({r[1] for r in results}) == 1
