"""Where a fresh process's time goes, kjit against the bare driver path: `python -m
benchmarks.fresh_profile`. Warms a cache, then runs each script under -X importtime and with
time marks, 5 times, and prints the medians: the marks of kjit's steps, the modules the kjit
path imports beyond the bare path's (self time), and both totals."""
from __future__ import annotations

import ast
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import kjit

from .compile_cache import BARE, SRC

RUNS = 5
BARE_MARKED = '''
import ctypes, time; t0 = time.perf_counter(); marks = []
def mark(what): marks.append((what, (time.perf_counter() - t0) * 1e3))
from cuda.bindings import driver as d; mark("import cuda.bindings")
d.cuInit(0); _, dev = d.cuDeviceGet(0); mark("cuInit")
_, ctx = d.cuDevicePrimaryCtxRetain(dev); d.cuCtxSetCurrent(ctx); mark("primary context")
_, mod = d.cuModuleLoad({cubin!r}.encode()); _, f = d.cuModuleGetFunction(mod, b"k3"); mark("load")
_, p = d.cuMemAlloc(64)
h = [ctypes.c_uint64(int(p)), ctypes.c_int32(7), ctypes.c_float(2.5)]
arr = (ctypes.c_void_p * 3)(*[ctypes.addressof(x) for x in h])
d.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, d.CUstream(0), ctypes.addressof(arr), 0); d.cuCtxSynchronize()
mark("launch + synchronize")
print("MARKS", marks)
'''
MARKED = '''
import time; t0 = time.perf_counter(); marks = []
def mark(what): marks.append((what, (time.perf_counter() - t0) * 1e3))
import kjit; mark("import kjit")
obj = kjit.compile({src!r}); mark("compile (disk hit)")
from kjit import driver; driver.primary_context(0); mark("context ready")
k = kjit.load(obj).get_function("k3"); mark("load + get_function")
buf = kjit.zeros(16, "float32"); mark("zeros")
k[1, 32](buf, 7, 2.5); mark("launch")
kjit.synchronize(); mark("synchronize")
print("MARKS", marks)
'''


def _importtime(code: str, env: dict) -> dict[str, int]:
    """{module: self time in us} from python -X importtime."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, env=env, timeout=120)
    out: dict[str, int] = {}
    for line in res.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        fields = line[len("import time:"):].split("|")
        if len(fields) == 3 and fields[0].strip().isdigit():
            out[fields[2].strip()] = int(fields[0])
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, KJIT_CACHE_DIR=str(Path(tmp) / "cache"))
        os.environ["KJIT_CACHE_DIR"] = env["KJIT_CACHE_DIR"]
        obj = kjit.compile(SRC)
        cubin = Path(tmp) / "k3.cubin"
        obj.save(cubin)
        kjit_code, bare_code = MARKED.format(src=SRC), BARE.format(cubin=str(cubin))
        for title, code in (("bare driver", BARE_MARKED.format(cubin=str(cubin))), ("kjit", kjit_code)):
            marks: dict[str, list[float]] = {}
            for _ in range(RUNS):
                res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     env=env, timeout=120)
                for what, ms in ast.literal_eval(res.stdout.split("MARKS", 1)[1].strip()):
                    marks.setdefault(what, []).append(ms)
            print(f"{title} fresh process, ms since the script's first line (median of {RUNS}):")
            for what, v in marks.items():
                print(f"  {what:24s} {statistics.median(v):8.2f}")
        kj = [_importtime(kjit_code, env) for _ in range(RUNS)]
        bare = [_importtime(bare_code, env) for _ in range(RUNS)]
        names = set().union(*kj) - set().union(*bare)
        rows = sorted(((statistics.median([d.get(n, 0) for d in kj]), n) for n in names), reverse=True)
        print(f"modules only the kjit path imports: {len(names)}, self time {sum(r[0] for r in rows) / 1e3:.2f} ms")
        for us, name in rows[:30]:
            print(f"  {name:40s} {us / 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
