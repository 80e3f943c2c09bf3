"""Benchmark 3: `kjit build` of the example library for 4 archs + PTX: serial vs parallel,
cold vs cached."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = "sm_80,sm_86,sm_90,sm_100"


def _build(src: Path, out: Path, jobs: int, env: dict) -> float:
    cmd = [sys.executable, "-m", "kjit", "build", str(src), "-o", str(out),
           "--arch", ARCHS, "--ptx", "compute_90", "--jobs", str(jobs)]
    extra = [f"-I{p}" for p in {src.parent, src.parent / "include"} if p.is_dir()]
    t0 = time.perf_counter()
    res = subprocess.run(cmd + extra, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"kjit build failed:\n{res.stdout}\n{res.stderr}")
    return (time.perf_counter() - t0) * 1e3


def run() -> dict:
    sources = sorted((ROOT / "examples" / "library").glob("*.cu"))
    if not sources:
        return {"skipped": "examples/library has no .cu file"}
    src = sources[0]
    out: dict = {"source": src.name, "archs": ARCHS + "+compute_90"}
    jobs = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        for label, j in (("serial", 1), (f"parallel ({jobs} jobs)", jobs)):
            env = dict(os.environ, KJIT_CACHE_DIR=str(Path(tmp) / f"cache-{j}"),
                       PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
            out[f"{label} cold ms"] = _build(src, Path(tmp) / f"a{j}.fatbin", j, env)
            out[f"{label} cached ms"] = _build(src, Path(tmp) / f"b{j}.fatbin", j, env)
            same = (Path(tmp) / f"a{j}.fatbin").read_bytes() == (Path(tmp) / f"b{j}.fatbin").read_bytes()
            out[f"{label} rebuild byte-identical"] = same
    return out
