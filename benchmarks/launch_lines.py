"""What a launch runs through in kjit's launch extension, counted: `python -m
benchmarks.launch_lines` (no GPU; needs valgrind and a C compiler).

Between two launches the driver's microseconds of work evict the launcher's code from the
instruction cache, so a launch pays for each line of code it runs (kjit/runtime/_path.h). This
builds a libcuda that does nothing (benchmarks/c/null_libcuda.c), runs a bound launcher
(`k[grid, block]` with a kjit array, then ints and floats: benchmarks/launch.py's kernels) and
Python's floor (benchmarks/c/py_floor.c's `launch_block`, the parameters as one block) under
callgrind, each in a process of its own, and counts in each one's extension the instructions
a launch executes and the distinct 64-byte lines they lie in: those run at every launch.
"""
from __future__ import annotations

import collections
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).parent
LAUNCHES = 20000
ARGS = (1, 3, 16)


def _null_driver(workdir: Path) -> Path:
    """The do-nothing libcuda.so.1, built into workdir: its directory."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", "-o", str(workdir / "libcuda.so.1"),
                    str(HERE / "c" / "null_libcuda.c")], check=True, capture_output=True)
    return workdir


def _floor_so(workdir: Path) -> Path:
    """Where Python's floor extension is built."""
    return workdir / ("py_floor" + sysconfig.get_config_var("EXT_SUFFIX"))


def _floor_extension(workdir: Path) -> Path:
    """benchmarks/c/py_floor.c built against the do-nothing libcuda and the toolkit's cuda.h."""
    from kjit.compiler import toolkit_headers
    cudart = toolkit_headers.located().get("cudart")
    if not cudart or not (Path(cudart) / "cuda.h").is_file():
        raise SystemExit("cuda.h was not found beside the CUDA runtime headers: install kjit's "
                         "CUDA extra (pip install 'kjit[cu13]')")
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    so = _floor_so(workdir)
    subprocess.run([*cc, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                    f"-I{cudart}", "-o", str(so), str(HERE / "c" / "py_floor.c"),
                    str(workdir / "libcuda.so.1")], check=True, capture_output=True)
    return so


def _child(what: str, nargs: int, workdir: Path, launches: int) -> None:
    """Under callgrind: `launches` launches of the bound launcher or of Python's floor."""
    from .kernels import launch_args
    from .timing import Loop
    if what == "floor":
        import importlib.util
        spec = importlib.util.spec_from_file_location("py_floor", _floor_so(workdir))
        floor = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(floor)
        block = ctypes.create_string_buffer(8 * nargs)
        floor.prepare_block(1, ctypes.addressof(block), 8 * nargs)
        Loop("launch({args})", [block, *launch_args(nargs)], launch=floor.launch_block)(launches)
        return
    from kjit.runtime import _launch as ext
    from kjit.runtime.memory import DeviceArray
    ext.bind()
    array = DeviceArray(16, "float32", ptr=1 << 40, device=0)
    kinds = [ext.K_I32 if isinstance(v, int) else ext.K_F32 for v in launch_args(nargs)]
    spec = b"".join(struct.pack("<ii", k, 8 * i) for i, k in enumerate([ext.K_ARRAY, *kinds]))

    def refuse(*args):
        raise SystemExit(f"the launch went to the Python path: {args}")
    cell = ctypes.c_uint64(0x1234)   # the do-nothing driver's context
    launcher = ext.launcher(refuse, refuse, spec, (array.launch_key,) + (None,) * len(kinds), DeviceArray,
                            [""], "k", 1, 0, 1, 1, 1, 32, 1, 1, 0, threading.get_ident(), cell,
                            ext.L_AUTO_STREAM | ext.L_HAS_ARRAYS, 0, 8 * nargs)
    Loop("L({args})", [array, *launch_args(nargs)], L=launcher)(launches)


def per_launch(out: Path, module: str) -> tuple[float, int, int]:
    """From a callgrind output (--dump-instr=yes): in the object whose path contains `module`,
    of the instructions run at every launch (at least LAUNCHES times), (how many a launch
    executes, how many distinct ones, the 64-byte lines they lie in)."""
    counts: collections.Counter = collections.Counter()
    names: dict[str, str] = {}
    in_module = skip = False
    last = 0
    for line in out.read_text().splitlines():
        m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(3):
                names[m.group(2)] = m.group(3)
            if m.group(1) == "ob":
                in_module = module in names[m.group(2)]
            continue
        if line.startswith("calls="):
            skip = True   # the next cost line is the call's, inclusive
            continue
        if not line or not (line[0].isdigit() or line[0] in "+-*"):
            continue
        parts = line.split()
        if len(parts) < 3:
            continue
        a = parts[0]
        addr = int(a, 16) if a.startswith("0x") else last + int(a) if a[0] in "+-" else last
        last = addr
        if skip:
            skip = False
        elif in_module:
            counts[addr] += int(parts[2])
    every = [a for a, n in counts.items() if n >= LAUNCHES]   # not the set-up, run once
    return sum(counts[a] for a in every) / LAUNCHES, len(every), len({a // 64 for a in every})


def run() -> dict:
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _null_driver(work)
        _floor_extension(work)
        env = dict(os.environ, LD_LIBRARY_PATH=f"{work}:{os.environ.get('LD_LIBRARY_PATH', '')}",
                   PYTHONPATH=f"{HERE.parent}:{os.environ.get('PYTHONPATH', '')}")
        for what, module in (("floor", "py_floor"), ("launcher", "kjit/runtime/_launch")):
            for n in ARGS:
                out = work / f"{what}{n}.out"
                subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes",
                                f"--callgrind-out-file={out}", sys.executable, "-m", "benchmarks.launch_lines",
                                "--child", what, str(n), str(work), str(LAUNCHES)], env=env, check=True, capture_output=True)
                results.setdefault(what, {})[n] = dict(zip(("instructions", "distinct", "lines"),
                                                           per_launch(out, module)))
    return results


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
        return
    res = run()
    print(f"per launch, in the extension's own code ({LAUNCHES} launches under callgrind): "
          "instructions executed / the 64-byte lines of code run at every launch")
    print(f"  {'':22s}" + "".join(f"{f'{n} args':>16s}" for n in ARGS))
    for what, label in (("floor", "Python's floor"), ("launcher", "kjit bound launcher")):
        print(f"  {label:22s}" + "".join(
            f"{res[what][n]['instructions']:>10.0f} / {res[what][n]['lines']:<3d}" for n in ARGS))
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        import json
        Path(sys.argv[2]).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
