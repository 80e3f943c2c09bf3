"""Cold autotuning of examples/autotune_sgemm.py's 54 configurations on 4096² fp32 (GPU
machine): each run in a fresh process on an empty cache directory, timed from the first
tune() call to its Result (the process's start, imports and the CUDA context excluded).
`python -m benchmarks.tune_cold`: the default (compiles overlapping timing, the screen, early
stopping) against every configuration timed in full (screen=None, early_stop=None), and
whether both chose the same configuration. Target (#35): the
default ≤ 5 s on an H100 with the same choice."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 5.0

RUN = r'''
import json, runpy, sys, time
import numpy as np, kjit
ex = runpy.run_path(sys.argv[1], run_name="not_main")
n, options = int(sys.argv[2]), json.loads(sys.argv[3])
rng = np.random.default_rng(0)
A = kjit.to_device(rng.standard_normal((n, n), dtype=np.float32))
B = kjit.to_device(rng.standard_normal((n, n), dtype=np.float32))
C = kjit.empty((n, n), "float32")
kjit.synchronize()
t0 = time.perf_counter()
r = ex["tuned"](progress=False, **options).tune(A, B, C, n, n, n)
wall = time.perf_counter() - t0
recs = [x for x in r.records if x]
print(json.dumps({"wall_s": round(wall, 2), "config": r.config.label(), "ms": round(r.ms, 4),
                  "timed": r.measured, "stopped": sum(1 for x in recs if x.get("stopped")),
                  "screened": sum(1 for x in recs if x.get("screened")),
                  "reps": sum(x.get("reps", 0) for x in recs)}))
'''


def cold(options: dict, n: int = 4096) -> dict:
    with tempfile.TemporaryDirectory(prefix="kjit-tune-cold-") as cache:
        env = dict(os.environ, KJIT_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", RUN, str(ROOT / "examples" / "autotune_sgemm.py"),
                              str(n), json.dumps(options)], env=env, capture_output=True, text=True,
                             timeout=600)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    res = {"default": cold({}), "exhaustive": cold({"early_stop": None, "screen": None})}
    a, b = res["default"], res["exhaustive"]
    if "error" not in a and "error" not in b:
        res["same choice"] = a["config"] == b["config"]
        res[f"default <= {TARGET_S} s"] = a["wall_s"] <= TARGET_S
    return res


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
