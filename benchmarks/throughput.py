"""Benchmark 6: compile throughput (`python -m benchmarks throughput`).

1. A sweep: VARIANTS variants of the CUB + cooperative groups + fp16 kernel, one at a time
   through bare NVRTC in this process (the same flags and include directories kjit passes),
   against kjit.compile_many on a fresh cache (and its rerun: all hits); its workers build a
   precompiled header at their first variant and start the others from it (how many did
   is reported), and the same sweep with KJIT_PCH=0 shows what the PCH adds.
2. A cold compile in a fresh process, small and CUB kernel: bare NVRTC, kjit (arch given and
   the device's), cuda.core and CuPy, each process with fresh caches, taking turns for
   ROUNDS rounds; the wall time from spawn to exit, and the median of per-round ratios to
   bare NVRTC.
3. Where kjit's fresh cold compile spends its time (arch given, and with a GPU the device's
   arch), by step, beside bare NVRTC's, with each process's start and exit.
The sweep and the kjit and bare rows need no GPU; CuPy and the device-arch rows skip without one.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from .kernels import HEADERS_SOURCE, launch_source

VARIANTS = int(os.environ.get("KJIT_BENCH_VARIANTS", "64"))
ROUNDS = int(os.environ.get("KJIT_BENCH_ROUNDS", "5"))
ROOT = Path(__file__).resolve().parent.parent


def variant(i: int) -> str:
    """The CUB kernel with a different constant, so every variant is its own compile."""
    return HEADERS_SOURCE.replace("out[blockIdx.x] = s;", f"out[blockIdx.x] = s + {i}.0f;")


def _arch() -> str:
    from kjit import arch as arch_mod, driver
    return arch_mod.resolve(None, "cuda").name if driver.available() else "sm_90"


def _include_dirs() -> list[str]:
    import kjit
    from kjit.compiler import include_path
    return list(include_path.for_options(kjit.CompileOptions(), "cuda").automatic_dirs)


def _bare_compile(src: str, arch: str, dirs: list[str], extra: Sequence[str] = ()) -> float:
    """Compile with bare NVRTC (kjit's flags and include directories, and `extra`); the
    seconds nvrtcCompileProgram took."""
    from cuda.bindings import nvrtc
    flags = [f"--gpu-architecture={arch}".encode()] + [f"-I{d}".encode() for d in dirs] + \
        [f.encode() for f in extra]
    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"kernel.cu", 0, [], [])
    t0 = time.perf_counter()
    (res,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
    spent = time.perf_counter() - t0
    assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS, (res, list(extra))
    err, n = nvrtc.nvrtcGetCUBINSize(prog)
    nvrtc.nvrtcGetCUBIN(prog, bytearray(n))
    nvrtc.nvrtcDestroyProgram(prog)
    return spent


def sweep(n: int = VARIANTS) -> dict:
    import kjit
    from kjit.compiler import pool
    arch, dirs = _arch(), _include_dirs()
    srcs = [variant(i) for i in range(n)]
    out: dict = {"variants": n, "arch": arch, "workers": pool.pool_size()}
    _bare_compile(variant(-1), arch, dirs)   # libnvrtc loaded before the clock starts
    t0 = time.perf_counter()
    for s in srcs:
        _bare_compile(s, arch, dirs)
    out["bare NVRTC one at a time s"] = time.perf_counter() - t0
    saved = os.environ.get("KJIT_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KJIT_CACHE_DIR"] = tmp
        try:
            t0 = time.perf_counter()
            objs = kjit.compile_many(srcs, arch=arch, progress=False)
            out["kjit.compile_many s"] = time.perf_counter() - t0
            assert not any(o.cache_hit for o in objs)
            out["kjit.compile_many PCH"] = {k: sum(o.metadata.get("pch") == k for o in objs)
                                            for k in ("created", "used")}
            t0 = time.perf_counter()
            assert all(o.cache_hit for o in kjit.compile_many(srcs, arch=arch, progress=False))
            out["kjit.compile_many rerun (all hits) s"] = time.perf_counter() - t0
        finally:
            pool.shared_pool().close()
    with tempfile.TemporaryDirectory() as tmp:   # the same without precompiled headers
        os.environ["KJIT_CACHE_DIR"], os.environ["KJIT_PCH"] = tmp, "0"
        try:
            t0 = time.perf_counter()
            kjit.compile_many(srcs, arch=arch, progress=False)
            out["kjit.compile_many, KJIT_PCH=0 s"] = time.perf_counter() - t0
        finally:
            pool.shared_pool().close()
            os.environ.pop("KJIT_PCH", None)
            if saved is None:
                os.environ.pop("KJIT_CACHE_DIR", None)
            else:
                os.environ["KJIT_CACHE_DIR"] = saved
    out["speed-up"] = out["bare NVRTC one at a time s"] / out["kjit.compile_many s"]
    out["speed-up, KJIT_PCH=0"] = out["bare NVRTC one at a time s"] / out["kjit.compile_many, KJIT_PCH=0 s"]
    return out


BARE = '''
import sys
from cuda.bindings import nvrtc
flags = [f.encode() for f in {flags!r}]
err, prog = nvrtc.nvrtcCreateProgram({src!r}.encode(), b"kernel.cu", 0, [], [])
(res,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
err, n = nvrtc.nvrtcGetCUBINSize(prog); buf = bytearray(n); nvrtc.nvrtcGetCUBIN(prog, buf)
assert res == nvrtc.nvrtcResult.NVRTC_SUCCESS and n > 0
'''
KJIT = '''
import kjit
assert kjit.compile({src!r}{arch}).cache_hit is False
'''
CORE = '''
try:
    from cuda.core import Program, ProgramOptions
except ImportError:
    from cuda.core.experimental import Program, ProgramOptions
obj = Program({src!r}, code_type="c++", options=ProgramOptions(arch={arch!r}, include_path={dirs!r})).compile("cubin")
assert len(obj.code) > 0
'''
CUPY = '''
import cupy as cp
k = cp.RawKernel({src!r}, {name!r}, options=tuple("-I" + d for d in {dirs!r}))
k.compile()
'''


def _have(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def _scripts(src: str, name: str, arch: str, dirs: list[str], gpu: bool) -> dict[str, str]:
    flags = [f"--gpu-architecture={arch}"] + [f"-I{d}" for d in dirs]
    out = {"bare NVRTC": BARE.format(src=src, flags=flags),
           "kjit (arch given)": KJIT.format(src=src, arch=f", arch={arch!r}")}
    if gpu:
        out["kjit (the device's arch)"] = KJIT.format(src=src, arch="")
    if _have("cuda.core"):
        out["cuda.core"] = CORE.format(src=src, arch=arch, dirs=dirs)
    if gpu and _have("cupy"):
        out["CuPy"] = CUPY.format(src=src, name=name, dirs=dirs)
    return out


def _run_fresh(code: str, tmp: Path) -> float:
    """Spawn to exit, in ms, with every cache fresh."""
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp / "kjit"), CUPY_CACHE_DIR=str(tmp / "cupy"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    ms = (time.perf_counter() - t0) * 1e3
    if res.returncode != 0:
        raise SystemExit(f"fresh-process compile failed:\n{code}\n{res.stderr[-3000:]}")
    return ms


def cold_table(rounds: int = ROUNDS) -> dict:
    from kjit import driver
    gpu, arch, dirs = driver.available(), _arch(), _include_dirs()
    out: dict = {"arch": arch, "rounds": rounds}
    for kernel, src, name in (("small", launch_source(3), "k3"), ("CUB", HEADERS_SOURCE, "half_sum")):
        scripts = _scripts(src, name, arch, dirs, gpu)
        runs: dict[str, list[float]] = {k: [] for k in scripts}
        for _ in range(rounds):
            for tool, code in scripts.items():   # taking turns: drift hits every tool alike
                with tempfile.TemporaryDirectory() as tmp:
                    runs[tool].append(_run_fresh(code, Path(tmp)))
        for tool, v in runs.items():
            ratios = [a / b for a, b in zip(v, runs["bare NVRTC"])]
            out[f"{kernel} kernel: {tool} ms"] = statistics.median(v)
            if tool != "bare NVRTC":
                out[f"{kernel} kernel: {tool} / bare NVRTC"] = (
                    f"{statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]")
    return out


# Each script prints its marks (ms since its first line); the parent adds the process's start
# (spawn to the first line) and exit (the last mark to the process's end), from SPAWN_T.
PRELUDE = """
import os, time, json; t0 = time.perf_counter(); M = {{}}
M["python start (spawn to the script's first line)"] = (time.time() - float(os.environ["SPAWN_T"])) * 1e3
def m(k): M[k] = (time.perf_counter() - t0) * 1e3
"""
TIMED = """
T = {{}}
def timed(places, name, label):
    # the first of `places` ("module:Class" or "module") that has `name`: modules move
    import importlib
    for place in places:
        mod, _, cls = place.partition(":")
        try:
            owner = importlib.import_module(mod)
            owner = getattr(owner, cls) if cls else owner
            f = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        def w(*a, _f=f, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                T[label] = T.get(label, 0) + (time.perf_counter() - t) * 1e3
        setattr(owner, name, w)
        return
STORE = ("kjit.cache.disk:DiskStore",)
"""
MARKS = PRELUDE + """
import kjit; m("import kjit")
import kjit.compiler.cached as cached; m("import the compile path")
from kjit.compiler import facts; facts.nvrtc(); m("NVRTC facts (loads libnvrtc)")
req = cached.make_request({src!r}, arch={arch!r}); m("validate the request")
""" + TIMED + """
timed(STORE, "_open", "  of which: cache databases created (a helper thread, beside NVRTC)")
timed(STORE, "_store", "  of which: the entry stored")
timed(("kjit.compiler.nvrtc",), "compile_source", "  of which: NVRTC")
assert kjit.compile({src!r}, arch={arch!r}).cache_hit is False; m("compile: key, lock, NVRTC, store")
M.update(T)
print("MARKS" + json.dumps(M))
"""
DEVICE_MARKS = PRELUDE + """
import kjit; m("import kjit")
""" + TIMED + """
timed(("kjit.driver",), "init", "  of which: cuda.bindings' import and the wait for cuInit")
timed(("kjit.driver",), "compute_capability", "  of which: the compute capability")
timed(STORE, "_open", "  of which: cache databases created (a helper thread, beside NVRTC)")
timed(("kjit.compiler.nvrtc",), "compile_source", "  of which: NVRTC")
assert kjit.compile({src!r}).cache_hit is False; m("kjit.compile with the device's arch")
M.update(T)
print("MARKS" + json.dumps(M))
"""
BARE_MARKS = PRELUDE + """
from cuda.bindings import nvrtc; m("import cuda.bindings.nvrtc")
nvrtc.nvrtcVersion(); m("libnvrtc loaded")
flags = [f.encode() for f in {flags!r}]
err, prog = nvrtc.nvrtcCreateProgram({src!r}.encode(), b"kernel.cu", 0, [], [])
(res,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
err, n = nvrtc.nvrtcGetCUBINSize(prog); nvrtc.nvrtcGetCUBIN(prog, bytearray(n)); m("compile")
print("MARKS" + json.dumps(M))
"""
EXIT = "exit (the script's last line to the process's end)"


def breakdown(rounds: int = ROUNDS) -> dict:
    """ms since each script's first line, median over rounds, small kernel, fresh caches;
    with the process's start and exit."""
    from kjit import driver
    arch, dirs = _arch(), _include_dirs()
    src = launch_source(3)
    scripts = {"kjit": MARKS.format(src=src, arch=arch),
               "bare NVRTC": BARE_MARKS.format(src=src, flags=[f"--gpu-architecture={arch}"]
                                               + [f"-I{d}" for d in dirs])}
    if driver.available():
        scripts["kjit (the device's arch)"] = DEVICE_MARKS.format(src=src)
    marks: dict[str, list[dict]] = {k: [] for k in scripts}
    for _ in range(rounds):
        for tool, code in scripts.items():
            with tempfile.TemporaryDirectory() as tmp:
                env = dict(os.environ, KJIT_CACHE_DIR=tmp, PYTHONPATH=os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
                env["SPAWN_T"] = repr(time.time())
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                     text=True, timeout=300)
                total = (time.perf_counter() - t0) * 1e3
                if "MARKS" not in res.stdout:
                    raise SystemExit(f"breakdown script failed:\n{res.stderr[-3000:]}")
                got = json.loads(res.stdout.split("MARKS", 1)[1])
                start = got.get("python start (spawn to the script's first line)", 0.0)
                last = max(v for k, v in got.items() if not k.startswith(("  ", "python start")))
                got[EXIT] = total - start - last
                got["process, spawn to exit"] = total
                marks[tool].append(got)
    out: dict = {}
    for tool, runs in marks.items():
        for step in runs[0]:
            out[f"{tool}: {step} ms"] = statistics.median(r.get(step, 0.0) for r in runs)
    return out


def run() -> dict:
    parts = {"sweep": sweep, "cold": cold_table, "breakdown": breakdown}
    wanted = os.environ.get("KJIT_BENCH_PARTS", ",".join(parts)).split(",")
    return {name: part() for name, part in parts.items() if name in wanted}


def lines(data: dict) -> list[str]:
    out = []
    for part, title in (("sweep", f"compile throughput: {VARIANTS} variants of the CUB kernel"),
                        ("cold", "cold compile in a fresh process (spawn to exit, fresh caches)"),
                        ("breakdown", "a fresh process's cold compile, small kernel: ms since its first line")):
        rows = data.get(part, {})
        if rows:
            out.append(title)
            out += [f"  {k:60s} {v:10.2f}" if isinstance(v, float) else f"  {k:60s} {v}"
                    for k, v in rows.items()]
    return out


if __name__ == "__main__":
    print("\n".join(lines(run())))
