"""The compile pool under faults (issue 40): workers run the parent's kjit whatever is planted
on their way, a worker that dies fails only the item it held and says how it died, the pool
recovers, and a fork while another thread compiles gives a child that can compile."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import kjit
from kjit.compiler import pool

ARCH = "sm_90"
ROOT = Path(kjit.__file__).resolve().parent.parent
# a compile that takes about a second here: a worker killed a moment after it began is in it
HEAVY = ('#include <cub/block/block_reduce.cuh>\n'
         'extern "C" __global__ void victim(float* p) {\n'
         '  using R = cub::BlockReduce<float, 128>;\n'
         '  __shared__ typename R::TempStorage t;\n'
         '  float s = R(t).Sum(p[threadIdx.x]);\n'
         '  if (threadIdx.x == 0) p[0] = s;\n'
         '}\n')


def light(i: int, tag: str) -> str:
    return f'extern "C" __global__ void k{i}(float* p) {{ p[0] = {i}.0f; }} // {tag}\n'


@pytest.fixture
def fresh_pool(monkeypatch):
    """A pool of this test's own: workers started here, closed after."""
    monkeypatch.setattr(pool, "_pool", None)
    yield
    if pool._pool is not None:
        pool._pool.close()


def _plant(where: Path, marks: Path, name: str) -> None:
    """A `kjit` package that leaves a mark when imported and then ends the process."""
    (where / "kjit").mkdir(parents=True)
    (where / "kjit" / "__init__.py").write_text(
        f"import os\nopen(os.path.join({str(marks)!r}, '{name}-kjit-%d' % os.getpid()), 'w').close()\n"
        f"raise SystemExit('the planted kjit in {where} was imported')\n")


def test_workers_run_the_parents_kjit_whatever_is_planted(tmp_path, monkeypatch, fresh_pool):
    """A kjit package in the working directory and on PYTHONPATH, with what would import it
    before the worker's own code runs: a sitecustomize and usercustomize on PYTHONPATH (run
    at interpreter start) and a json module in the working directory (`python -c` puts it
    first, and the worker's first line imports json). Round 4 of issue 40 ran the planted
    kjit in the worker on 33e3ae6."""
    marks = tmp_path / "marks"
    marks.mkdir()
    cwd, pp = tmp_path / "cwd", tmp_path / "pp"
    _plant(cwd, marks, "cwd")
    _plant(pp, marks, "pythonpath")
    importer = ("import os, sys\nopen(os.path.join({marks!r}, '{name}-%d' % os.getpid()), 'w').close()\n"
                "sys.path.insert(0, {where!r})\nimport kjit\n")
    (cwd / "json.py").write_text(importer.format(marks=str(marks), name="json", where=str(cwd)))
    for name in ("sitecustomize", "usercustomize"):
        (pp / f"{name}.py").write_text(importer.format(marks=str(marks), name=name, where=str(pp)))
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PYTHONPATH", str(pp))
    monkeypatch.setenv("PYTHONSTARTUP", str(pp / "sitecustomize.py"))
    objs = kjit.compile_many([light(i, "planted") for i in range(4)], arch=ARCH, jobs=2,
                             progress=False)
    assert [sorted(o.entry_points) for o in objs] == [[f"k{i}"] for i in range(4)]
    assert [o.cache_hit for o in objs] == [False] * 4          # compiled by the workers
    assert pool.shared_pool().started == 2
    assert sorted(os.listdir(marks)) == []                     # nothing planted ran anywhere


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_worker_killed_mid_compile_fails_only_its_item_and_the_pool_recovers(
        monkeypatch, fresh_pool, sig):
    """Round 4 of issue 40: `ValueError: seek of closed file` on 33e3ae6. The worker holding
    the heavy item is killed (by pid, from here) once it has spent CPU time compiling it."""
    holder: dict[str, int] = {}
    sent = threading.Event()
    real_ask = pool._Worker.ask

    def ask(self, request, *args, **kw):
        if '"victim.cu"' in request and not sent.is_set():
            holder["pid"] = self.proc.pid
            sent.set()
        return real_ask(self, request, *args, **kw)

    monkeypatch.setattr(pool._Worker, "ask", ask)

    def killer() -> None:
        assert sent.wait(120)
        pid = holder["pid"]
        start = _cpu_seconds(pid)
        deadline = time.monotonic() + 60
        while _cpu_seconds(pid) - start < 0.3 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, sig)

    items = [light(0, sig.name), light(1, sig.name), {"source": HEAVY, "name": "victim.cu"},
             light(3, sig.name), light(4, sig.name), light(5, sig.name)]
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    got = kjit.compile_many(items, arch=ARCH, jobs=2, errors="return", progress=False)
    t.join(5)
    dead = got[2]
    assert isinstance(dead, kjit.KjitError), dead
    text = str(dead)
    assert sig.name in text and f"status {-sig}" in text and f"worker {holder['pid']}" in text
    assert "compile_many item 2 (victim.cu)" in text
    assert isinstance(dead, pool.WorkerDied) and dead.signal == sig.name
    assert [sorted(o.entry_points) for i, o in enumerate(got) if i != 2] == \
        [[f"k{i}"] for i in (0, 1, 3, 4, 5)]
    # the pool goes on: the next batch compiles everything, the killed item included
    again = kjit.compile_many([{"source": HEAVY, "name": "victim.cu"}, light(6, sig.name),
                               light(7, sig.name)], arch=ARCH, jobs=2, progress=False)
    assert sorted(again[0].entry_points) == ["victim"]
    assert holder["pid"] not in pool.shared_pool().pids()


def test_a_worker_found_dead_before_its_item_is_replaced(monkeypatch, fresh_pool):
    """A worker that dies between batches is not blamed for the next batch's items: the item
    goes to a new worker."""
    kjit.compile_many([light(i, "first") for i in range(2)], arch=ARCH, jobs=2, progress=False)
    p = pool.shared_pool()
    pids = p.pids()
    assert len(pids) == 2
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # taken as alive (as a worker killed the instant after the check would be)
    monkeypatch.setattr(pool._Worker, "usable", lambda self: True)
    time.sleep(0.2)
    objs = kjit.compile_many([light(i, "second") for i in range(2, 6)], arch=ARCH, jobs=2,
                             progress=False)
    assert [sorted(o.entry_points) for o in objs] == [[f"k{i}"] for i in range(2, 6)]
    assert p.started == 4


FORK_WHILE_COMPILING = textwrap.dedent('''
    import json, os, signal, sys, threading, time
    import kjit
    from kjit.compiler import pool
    heavy = {heavy!r}
    light = 'extern "C" __global__ void c%d(float* p) {{ p[0] = %d; }}\\n'
    kjit.compile_many([light % (i, i) for i in (1, 2)], arch="sm_90", jobs=2, progress=False)
    started = pool.shared_pool().started            # two idle workers of this process
    busy = threading.Event()
    done = []
    def compile_heavy():
        busy.set()
        for i in range(3):
            done.append(kjit.compile(heavy.replace("victim", "v%d" % i), arch="sm_90", cache=False))
    t = threading.Thread(target=compile_heavy)
    t.start()
    busy.wait()
    time.sleep(0.5)                                  # inside NVRTC by now
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(120)                            # a hang ends as SIGALRM, not forever
        obj = kjit.compile(light % (3, 3), arch="sm_90", cache=False)
        many = kjit.compile_many([light % (i, i) for i in (4, 5)], arch="sm_90", jobs=2,
                                 cache=False, progress=False)
        print(json.dumps({{"child": [sorted(obj.entry_points)] + [sorted(o.entry_points) for o in many]}}),
              flush=True)
        sys.exit(0)                                  # atexit runs: the parent's workers stay
    _, status = os.waitpid(pid, 0)
    t.join()
    kept = pool.shared_pool().pids()
    kjit.compile_many([light % (i, i) for i in (6, 7)], arch="sm_90", jobs=2, progress=False)
    print(json.dumps({{"status": os.waitstatus_to_exitcode(status), "heavy": len(done),
                      "kept": len(kept), "started": pool.shared_pool().started - started}}))
''')


def test_fork_while_another_thread_compiles_gives_a_child_that_compiles(tmp_path):
    """Round 4 of issue 40: the child hung in NVRTC's lock at its first compile on 33e3ae6.
    The child compiles in its process and through a pool of its own; its exit leaves the
    parent's idle workers running, and the parent uses them again."""
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", FORK_WHILE_COMPILING.format(heavy=HEAVY)],
                         env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    child = next(x for x in lines if "child" in x)
    parent = next(x for x in lines if "status" in x)
    assert child["child"] == [["c3"], ["c4"], ["c5"]]
    assert parent == {"status": 0, "heavy": 3, "kept": 2, "started": 0}, (parent, res.stderr[-2000:])


def test_a_child_forked_from_inside_a_compile_refuses_to_compile_with_nvrtc(monkeypatch):
    """Where a compile is still in flight at the fork (here: the forking thread's own), the
    child says why it cannot compile, instead of waiting forever for NVRTC's lock."""
    from kjit.compiler import forkgate
    gate = forkgate._gate
    gate.enter()                       # as if this thread were inside an NVRTC compile
    try:
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                kjit.compile(light(9, "child"), arch=ARCH, cache=False)
                code = 1
            except kjit.KjitError as exc:
                code = 0 if "forked" in str(exc) and "spawn" in str(exc) else 2
            finally:
                os._exit(code)
    finally:
        gate.leave()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(kjit.compile(light(9, "parent"), arch=ARCH, cache=False).entry_points) == ["k9"]
