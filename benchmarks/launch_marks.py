"""Where a kjit launch's time goes, step by step, in the benchmark's own loop:
`python -m benchmarks.launch_marks`.

Timing the launch's pieces on their own (benchmarks/launch_profile.py) says what they cost with
warm caches; between two launches, though, the driver's work (microseconds) leaves kjit's code,
data and branch history cold, and the pieces cost more. So this builds kjit's C launcher with
timestamps at its steps (KJIT_MARK, benchmarks/c/launch_marks.h: the TSC on x86-64),
loads it in place of the installed one, and runs the launch benchmark's kjit rows paired with
C's loop as benchmarks/launch.py does. Per launch, in ns: Python's part (the loop, the call
into the launcher, its return), the launcher's checks (thread, argument count, a live
context; the current context only after the driver refused a launch), packing, the stream, the kernel's name and the GIL, cuLaunchKernel itself and the
return; each net of what a timestamp costs. C's loop (ns per launch) is beside them: the driver
step against it says whether the driver runs slower inside kjit's launches than in C's loop.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .launch_build import build, load, runtime_dir

HERE = Path(__file__).parent
ROUNDS = int(os.environ.get("KJIT_BENCH_MARKS_ROUNDS", "11"))
STEPS = ("Python: loop, call, return", "checks and current context", "packing",
         "stream, name, GIL", "cuLaunchKernel", "return")


def build_marked(workdir: Path):
    """kjit's launch extension built with the step marks, registered as kjit.runtime._launch
    (before kjit imports it)."""
    if "kjit.runtime._launch" in sys.modules:
        raise SystemExit("kjit's launch extension is loaded already: run this module on its own "
                         "(python -m benchmarks.launch_marks)")
    so = build(runtime_dir(), workdir, ("-include", str(HERE / "c" / "launch_marks.h")))
    module = load(so)
    sys.modules["kjit.runtime._launch"] = module
    return module


def _ticks_per_ns(ext) -> float:
    t0, c0 = time.perf_counter_ns(), ext.marks_now()
    time.sleep(0.2)
    return (ext.marks_now() - c0) / (time.perf_counter_ns() - t0)


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ext = build_marked(Path(tmp))
        from .launch import CInProcess, KjitBound, KjitCuPy, KjitGetitem, KjitTorch, Toolkit, paired_round
        per_ns = _ticks_per_ns(ext)
        mark = statistics.median(ext.marks_cost(100000) for _ in range(5))   # ticks

        class Marked(Toolkit):
            """A kjit row whose batches also collect the launcher's step sums."""

            def __init__(self, row):
                self.row, self.name, self.c_stream, self.got = row, row.name, row.c_stream, []

            def prepare(self, n):
                self.row.prepare(n)

            def batch(self, n):
                ext.marks()   # empties them
                us = self.row.batch(n)
                self.got.append(ext.marks())
                return us

            def sync(self):
                self.row.sync()

        floor = CInProcess(Path(tmp))
        rows = []
        for factory in (KjitBound, KjitGetitem, KjitTorch, KjitCuPy):
            try:
                rows.append(Marked(factory()))
            except Exception as exc:   # a framework that is missing
                print(f"{factory.name}: unavailable ({type(exc).__name__}: {exc})")
        results: dict = {"ticks_per_ns": per_ns, "mark_ns": mark / per_ns, "rows": {}}
        for n in (1, 3, 16):
            floor.prepare(n)
            for row in rows:
                row.prepare(n)
            rounds: dict = {row.name: [] for row in rows}
            for r in range(-1, ROUNDS):
                for row in rows[r % len(rows):] + rows[:r % len(rows)]:
                    row.got = []
                    ours, c = paired_round(row, floor, n)
                    if r >= 0:
                        rounds[row.name].append((ours, c, row.got))
            for row in rows:
                got = rounds[row.name]
                launches = [g for _, _, batch in got for g in batch if g[0]]

                def step_ns(i: int) -> float:   # median over batches, per launch, less one mark
                    if i == 0:
                        vals = [g[2] / g[1] for g in launches if g[1]]
                    else:
                        vals = [g[3][i - 1] / g[0] for g in launches]
                    return round(statistics.median(vals) / per_ns - mark / per_ns, 1)
                results["rows"].setdefault(row.name, {})[n] = {
                    "ratio": round(statistics.median(o / c for o, c, _ in got), 3),
                    "us": round(statistics.median(o for o, _, _ in got), 3),
                    "c_us": round(statistics.median(c for _, c, _ in got), 3),
                    "steps_ns": {STEPS[i]: step_ns(i) for i in range(len(STEPS))}}
    return results


def main() -> None:
    res = run()
    print(f"one timestamp costs {res['mark_ns']:.1f} ns, taken out of each step below; "
          f"median over batches, ns per launch")
    for name, by_n in res["rows"].items():
        print(f"\n{name}")
        print(f"  {'args':>4} {'ratio':>6} {'C ns':>6}  " + "  ".join(f"{s[:22]:>22}" for s in STEPS))
        for n, r in by_n.items():
            print(f"  {n:>4} {r['ratio']:6.3f} {r['c_us'] * 1e3:6.0f}  "
                  + "  ".join(f"{v:22.0f}" for v in r["steps_ns"].values()))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        import json
        Path(sys.argv[2]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
