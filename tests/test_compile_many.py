"""kjit.compile_many: hits here, misses in a pool of worker processes that import this kjit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kjit
from kjit import progress
from kjit.compiler import many, pool
from kjit.errors import CompileError, InvalidOptionError

ARCH = "sm_90"
ROOT = Path(kjit.__file__).resolve().parent.parent


def src(i: int, tag: str = "") -> str:
    return f'extern "C" __global__ void k{i}(float* p) {{ p[0] = {i}.0f; }} // {tag}\n'


@pytest.fixture
def spy(monkeypatch):
    """Records what goes to the pool: the item names sent and the worker count asked for."""
    sent: list[str] = []
    runs: list[int] = []
    real_request, real_run = many._request, pool.Pool.run

    def request(item):
        sent.append(item[1].name)
        return real_request(item)

    def run(self, jobs, workers, on_reply):
        runs.append(workers)
        return real_run(self, jobs, workers, on_reply)

    monkeypatch.setattr(many, "_request", request)
    monkeypatch.setattr(pool.Pool, "run", run)
    return sent, runs


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_results_come_back_in_order_from_the_pool(spy):
    objs = kjit.compile_many([src(i, "order") for i in range(5)], arch=ARCH, jobs=2)
    assert [set(o.entry_points) for o in objs] == [{f"k{i}"} for i in range(5)]
    assert [o.cache_hit for o in objs] == [False] * 5
    sent, runs = spy
    assert len(sent) == 5 and runs == [2]


def test_items_carry_their_own_options_and_names():
    tmpl = "template <int N> __global__ void t(int* p) { p[0] = N; }\n"
    objs = kjit.compile_many([
        {"source": tmpl, "name_expressions": ["t<3>"], "name": "t3.cu"},
        {"source": src(1, "ptx"), "target": "ptx"},
        {"source": src(2, "def"), "options": kjit.CompileOptions(defines=["X=1"]), "arch": "sm_80"},
    ], arch=ARCH, jobs=2)
    assert objs[0].symbols == {"t<3>": "_Z1tILi3EEvPi"} and objs[0].name == "t3.cu"
    assert objs[1].kind == "ptx" and objs[1].code.startswith(b"//")
    assert objs[2].arch == "sm_80"


def test_hits_are_not_sent_to_the_pool(spy):
    warm = [src(i, "hits") for i in range(3)]
    kjit.compile_many(warm, arch=ARCH, jobs=2)
    sent, runs = spy
    sent.clear(), runs.clear()
    objs = kjit.compile_many(warm + [src(7, "hits"), src(8, "hits")], arch=ARCH, jobs=2)
    assert [o.cache_hit for o in objs] == [True, True, True, False, False]
    assert len(sent) == 2 and runs == [2]
    sent.clear(), runs.clear()
    assert all(o.cache_hit for o in kjit.compile_many(warm, arch=ARCH, jobs=2))
    assert sent == [] and runs == []


def test_the_parent_runs_no_compile_for_a_batch_of_misses(monkeypatch):
    from cuda.bindings import nvrtc
    created = []
    real = nvrtc.nvrtcCreateProgram
    monkeypatch.setattr(nvrtc, "nvrtcCreateProgram", lambda *a: (created.append(a[1]), real(*a))[1])
    objs = kjit.compile_many([src(i, "parent-idle") for i in range(3)], arch=ARCH, jobs=2)
    assert [o.cache_hit for o in objs] == [False] * 3 and created == []


def test_a_single_miss_compiles_here(spy):
    kjit.compile(src(1, "single"), arch=ARCH)
    objs = kjit.compile_many([src(1, "single"), src(2, "single")], arch=ARCH, jobs=2)
    assert [o.cache_hit for o in objs] == [True, False]
    assert spy == ([], [])


def test_errors_belong_to_their_item(spy):
    bad = 'extern "C" __global__ void bad(int* p) { p[0] = undefined_name; }\n'
    got = kjit.compile_many([src(1, "err"), bad, src(2, "err")], arch=ARCH, jobs=2,
                            errors="return")
    assert isinstance(got[1], CompileError) and "undefined_name" in str(got[1])
    assert set(got[0].entry_points) == {"k1"} and set(got[2].entry_points) == {"k2"}
    with pytest.raises(CompileError) as info:
        kjit.compile_many([src(3, "err"), bad, bad.replace("bad(", "bad2(")], arch=ARCH, jobs=2)
    assert "undefined_name" in str(info.value)
    assert any("1 more of the 3 items failed" in n for n in info.value.__notes__)


def test_bad_arguments_are_refused_before_anything_compiles(spy):
    with pytest.raises(InvalidOptionError, match="item 1: .*sm_XY"):
        kjit.compile_many([src(1, "bad-arg"), {"source": src(2), "arch": "hopper"}], arch=ARCH)
    with pytest.raises(InvalidOptionError, match="item 0: unknown keys \\['opts'\\]"):
        kjit.compile_many([{"source": src(1), "opts": 1}], arch=ARCH)
    with pytest.raises(InvalidOptionError, match="list of sources"):
        kjit.compile_many(src(1), arch=ARCH)
    with pytest.raises(InvalidOptionError, match="errors="):
        kjit.compile_many([src(1)], arch=ARCH, errors="ignore")
    assert spy == ([], [])


def test_pool_size_from_cores_argument_and_environment(monkeypatch, spy):
    monkeypatch.delenv(pool.ENV_JOBS, raising=False)
    assert pool.pool_size() == len(os.sched_getaffinity(0))
    assert pool.pool_size(3) == 3
    monkeypatch.setenv(pool.ENV_JOBS, "5")
    assert pool.pool_size() == 5 and pool.pool_size(2) == 2
    for bad in ("0", "many"):
        monkeypatch.setenv(pool.ENV_JOBS, bad)
        with pytest.raises(InvalidOptionError, match=pool.ENV_JOBS):
            pool.pool_size()
    with pytest.raises(InvalidOptionError, match="jobs=0"):
        kjit.compile_many([src(1)], arch=ARCH, jobs=0)
    # one worker means no pool: every miss compiles here, in order
    monkeypatch.setenv(pool.ENV_JOBS, "1")
    objs = kjit.compile_many([src(i, "one-job") for i in range(3)], arch=ARCH)
    assert [o.cache_hit for o in objs] == [False] * 3 and spy == ([], [])


def test_progress_callable_counts_every_item():
    seen = []
    kjit.compile_many([src(i, "progress") for i in range(3)], arch=ARCH, jobs=2,
                      progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_progress_bar_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)
    monkeypatch.setattr(many, "BAR_AFTER_S", 0.0)
    kjit.compile_many([src(i, "bar") for i in range(3)], arch=ARCH, jobs=2)
    assert "kjit: compiling" in capsys.readouterr().err
    kjit.compile_many([src(i, "nobar") for i in range(3)], arch=ARCH, jobs=2, progress=False)
    assert "kjit: compiling" not in capsys.readouterr().err
    monkeypatch.setattr(many, "BAR_AFTER_S", 2.0)   # a quick batch (hits) shows none
    kjit.compile_many([src(i, "bar") for i in range(3)], arch=ARCH, jobs=2)
    assert "kjit: compiling" not in capsys.readouterr().err


PARENT = textwrap.dedent('''
    import sys, time, kjit
    from kjit.compiler import pool
    kjit.compile_many([f'extern "C" __global__ void k{i}(int* p) {{ p[0] = {i}; }} // parent'
                       for i in range(4)], arch="sm_90", jobs=2)
    print(*pool.shared_pool().pids(), flush=True)
    time.sleep(60)
''')


def _parent(tmp_path, **env):
    e = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **env)
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=e, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    return proc, pids


def _gone(pids, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_workers_die_with_the_parent(tmp_path):
    proc, pids = _parent(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone(pids, 5.0)


BUSY_PARENT = textwrap.dedent('''
    import sys, threading, time, kjit
    sys.path.insert(0, {bench!r})
    from benchmarks.kernels import HEADERS_SOURCE
    srcs = [HEADERS_SOURCE.replace("out[blockIdx.x] = s;", f"out[blockIdx.x] = s + {{i}};") for i in range(2)]
    threading.Thread(target=kjit.compile_many, args=(srcs,), kwargs={{"arch": "sm_90", "jobs": 2}},
                     daemon=True).start()
    time.sleep(60)
''')


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().split(")")[-1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_workers_die_with_the_parent_in_the_middle_of_a_compile(tmp_path):
    """A CUB compile takes seconds: the workers must not finish it once their parent is gone."""
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen([sys.executable, "-c", BUSY_PARENT.format(bench=str(ROOT))], env=env)
    deadline = time.monotonic() + 60
    while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) == 2
    time.sleep(1.0)   # booted and compiling (the first CUB compile takes seconds)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone(workers, 1.5)


def test_idle_workers_leave_and_the_next_batch_starts_new_ones(tmp_path):
    proc, pids = _parent(tmp_path, KJIT_COMPILE_POOL_IDLE="1")
    try:
        assert _gone(pids, 5.0)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
    p = pool.Pool()
    p._idle.append(w := pool._Worker())
    w.last_used -= 3600   # past its idle time: never handed a request
    fresh = p._take()
    try:
        assert fresh is not w and p.started == 1
    finally:
        fresh.close()


def test_workers_import_the_parents_kjit(tmp_path, monkeypatch, spy):
    """A second kjit tree first on the path a worker would otherwise start with (the working
    directory, as after `pip install .` in the repository root, and PYTHONPATH)."""
    decoy = tmp_path / "checkout"
    (decoy / "kjit").mkdir(parents=True)
    (decoy / "kjit" / "__init__.py").write_text("raise SystemExit('the decoy kjit was imported')\n")
    monkeypatch.chdir(decoy)
    monkeypatch.setenv("PYTHONPATH", str(decoy))
    monkeypatch.setattr(pool, "_pool", None)   # workers started here, from the decoy's directory
    objs = kjit.compile_many([src(i, "decoy") for i in range(3)], arch=ARCH, jobs=2)
    assert [o.cache_hit for o in objs] == [False] * 3 and len(spy[0]) == 3
    pool.shared_pool().close()


def test_worker_with_another_kjit_is_refused(monkeypatch):
    monkeypatch.setattr(pool, "kjit_dir", lambda: Path("/nonexistent/kjit"))
    w = pool._Worker()
    try:
        with pytest.raises(kjit.KjitError, match="compile worker imported kjit from"):
            w.ask("{}")
    finally:
        w.close()


def test_precompile_specializations_in_parallel(spy):
    @kjit.kernel
    def fill(V=0):
        return f'extern "C" __global__ void fill(int* p) {{ p[0] = {V}; }} // precompile\n'

    fns = fill.precompile([{"V": v} for v in range(4)], arch=ARCH, jobs=2)
    assert [f.params for f in fns] == [{"V": v} for v in range(4)]
    assert fns[2] is fill.specialize(V=2)
    assert len(spy[0]) == 4
    assert all(f.compile(ARCH).cache_hit for f in fns)


COLD = textwrap.dedent('''
    import sys, threading, kjit
    from kjit.cache import lookup
    from kjit.compiler import nvrtc
    real, seen = nvrtc.compile_source, []
    def watched(*a, **k):   # what runs beside NVRTC
        seen.extend(t.name for t in threading.enumerate())
        return real(*a, **k)
    nvrtc.compile_source = watched
    assert kjit.compile('extern "C" __global__ void k(int* p) { p[0] = 1; }', arch="sm_90").cache_hit is False
    print("kjit.cache.shared" in sys.modules, "kjit-cache-open" in seen)
''')


def test_a_cold_compile_opens_the_cache_beside_nvrtc_and_no_remote_tier(tmp_path):
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("KJIT_REMOTE_CACHE", None)
    out = subprocess.run([sys.executable, "-c", COLD], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "True"], out.stderr


@pytest.mark.gpu
def test_precompiled_specializations_launch_on_the_device():
    """precompile() for the device's arch, in workers; each launch then loads from the cache."""
    @kjit.kernel
    def put(V=0):
        return f'extern "C" __global__ void put(int* p) {{ p[0] = {V}; }} // gpu precompile\n'

    fns = put.precompile([{"V": v} for v in (3, 5, 7)], jobs=2)
    for f, v in zip(fns, (3, 5, 7)):
        out = kjit.zeros(1, "int32")
        f[1, 1](out)
        kjit.synchronize()
        assert int(out.get()[0]) == v
        assert f.object.cache_hit is True


def test_an_on_result_callback_that_raises_is_raised_after_every_item_compiled():
    # a worker's serving thread used to die with it, leaving the items after it as None
    srcs = [f'extern "C" __global__ void k{i}(int* p) {{ p[0] = {i}; }}' for i in range(6)]
    seen = []

    def broken(i, result):
        seen.append(i)
        raise RuntimeError("callback broke")

    with pytest.raises(RuntimeError, match="callback broke"):
        kjit.compile_many(srcs, arch="sm_80", jobs=2, on_result=broken)
    assert sorted(seen) == list(range(6))
    assert all(kjit.compile(s, arch="sm_80").cache_hit for s in srcs)   # and every one stored
