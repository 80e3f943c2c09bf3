"""What each piece of kjit's bound launcher costs: `python -m benchmarks.launch_pieces`.

The launcher's own work between Python's call and cuLaunchKernel is a few tens of
nanoseconds, below what a timestamp per step resolves once the driver's microseconds have left
caches cold (launch_marks.py). So this builds copies of kjit's launch extension, each with one
piece of that work taken out (the source edited in a temporary directory), and times them
with the same arguments, paired with C's loop batch by batch as benchmarks/launch.py pairs
(rounds interleaved, every variant taking each place in turn), beside Python's floor in both
forms (`void**`, and the parameters as one block, as kjit hands them) and an unedited copy
built the same way. A copy without a piece is not a launcher to ship: "packed once" launches
the first call's arguments ever after, "no context cell" never notices its context's end.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from .launch_build import build, load, runtime_dir

ROUNDS = int(os.environ.get("KJIT_BENCH_PIECES_ROUNDS", "21"))

# piece -> edits of _launch.c, each applying exactly once (tests/test_launch_pieces.py checks)
_LAST = re.compile(r"    if \(unlikely\(PyList_GET_SIZE\(L->last\) < 1 \|\| .*?note_name\(L\) < 0\)\n"
                   r"        return NULL;\n", re.S)
PIECES: dict[str, list[tuple[str | re.Pattern, str]]] = {
    "no kernel-name note": [(_LAST, "")],
    "no context cell": [(" || *L->ctx == NO_CONTEXT))", "))"),
                        ("void* ctx = (void*)(uintptr_t)*L->ctx;", "void* ctx = NULL;")],
    "packed once": [("    int ask; ", "    int packed;\n    int ask; "),
                    ("    L->ask = 0;\n", "    L->ask = 0;\n    L->packed = 0;\n"),
                    ("Py_ssize_t r = launcher_pack(L, args, &seen);",
                     "Py_ssize_t r = L->packed ? 0 : launcher_pack(L, args, &seen); L->packed = 1;")],
}
PIECES["all out, GIL not checked"] = [e for name in list(PIECES) for e in PIECES[name]]


def edited(source: str, edits: list[tuple[str | re.Pattern, str]]) -> str:
    """`source` with each edit made; an edit that does not apply exactly once raises."""
    for old, new in edits:
        if isinstance(old, re.Pattern):
            source, count = old.subn(new, source)
        else:
            count = source.count(old)
            source = source.replace(old, new)
        if count != 1:
            raise ValueError(f"the edit {old!r} applies {count} times to _launch.c, not once")
    return source


def build_copies(workdir: Path) -> dict[str, Path]:
    """An unedited copy ("kjit bound launcher") and one per piece: name -> built extension."""
    copies = {}
    for name, edits in {"kjit bound launcher": [], **PIECES}.items():
        d = workdir / re.sub(r"\W+", "_", name)
        shutil.copytree(runtime_dir(), d, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        (d / "_launch.c").write_text(edited((d / "_launch.c").read_text(), edits))
        copies[name] = build(d, d)
    return copies


def run() -> dict:
    import numpy as np

    import kjit
    from kjit.runtime import kernel as kernel_mod

    from .kernels import expected, launch_args, launch_source
    from .launch import CInProcess, PythonFloor, PythonFloorBlock, Toolkit, paired_round
    from .timing import Loop

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        mods = {name: load(so) for name, so in build_copies(work).items()}
        for m in mods.values():
            m.bind()
        made: dict[int, tuple] = {}   # the shipped launcher's arguments, to build each copy's
        real = kernel_mod.c_function

        def capture(name):
            f = real(name)
            if name != "launcher" or f is None:
                return f

            def make(*a):
                launcher = f(*a)
                made[id(launcher)] = a
                return launcher
            return make
        kernel_mod.c_function = capture

        class Copy(Toolkit):
            def __init__(self, name, module, gil_mode=0):
                self.name, self.module, self.gil_mode, self.state = name, module, gil_mode, {}

            def prepare(self, n):
                k = kjit.load(kjit.compile(launch_source(n))).get_function(f"k{n}")
                buf = kjit.zeros(16, np.float32)
                args = [buf, *launch_args(n)]
                shipped = k[1, 32]
                self.state[n] = (buf, Loop("L({args})", args, L=self.module.launcher(*made[id(shipped)])))

            def batch(self, n):
                self.module.gil_mode(self.gil_mode)
                try:
                    return super().batch(n)
                finally:
                    self.module.gil_mode(0)

            def check(self, n):
                got = float(self.state[n][0].get()[0])
                if abs(got - expected(n)) >= 1e-3:
                    raise SystemExit(f"{self.name} with {n} args left {got}, expected {expected(n)}")

        try:
            floor = CInProcess(work)
            py_floor = PythonFloor(work)
            rows: list[Toolkit] = [py_floor, PythonFloorBlock(py_floor)]
            for name, m in mods.items():
                rows.append(Copy(name, m, 1 if name == "all out, GIL not checked" else 0))
            unedited = mods["kjit bound launcher"]
            rows += [Copy("GIL not checked", unedited, 1), Copy("GIL released", unedited, 2)]
            results: dict = {}
            for n in (1, 3, 16):
                floor.prepare(n)
                for row in rows:
                    row.prepare(n)
                got: dict[str, list[tuple[float, float]]] = {row.name: [] for row in rows}
                for r in range(-1, ROUNDS):
                    turn = (r + 1) % len(rows)
                    for row in rows[turn:] + rows[:turn]:
                        ours = paired_round(row, floor, n)
                        if r >= 0:
                            got[row.name].append(ours)
                for row in rows:
                    if isinstance(row, Copy):
                        row.check(n)
                base = [u for u, _ in got["kjit bound launcher"]]
                for name, pairs in got.items():
                    to_c = [u / c for u, c in pairs]
                    to_l = [u / b for (u, _), b in zip(pairs, base)]
                    results.setdefault(name, {})[n] = {
                        "ratio": round(statistics.median(to_c), 3), "min": round(min(to_c), 3),
                        "max": round(max(to_c), 3), "to_launcher": round(statistics.median(to_l), 3),
                        "us": round(statistics.median(u for u, _ in pairs), 3)}
            return results
        finally:
            kernel_mod.c_function = real


def main() -> None:
    res = run()
    print(f"median of per-round ratios over {ROUNDS} rounds: to C's loop [min-max], and to the "
          f"unedited launcher")
    for name, by_n in res.items():
        print(f"  {name:38s} " + "   ".join(
            f"{n:>2}: {r['ratio']:.3f} [{r['min']:.3f}-{r['max']:.3f}] {r['to_launcher']:.3f}"
            for n, r in by_n.items()))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        import json
        Path(sys.argv[2]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
