"""`import kjit` is cheap and touches no driver: measured in fresh interpreters."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_MS = 150.0

# Runs in a fresh interpreter: times `import kjit` alone (not Python's own start-up) and
# reports what it loaded. /proc/self/maps shows shared libraries actually mapped.
PROBE = r'''
import json, sys, time
t0 = time.perf_counter()
import kjit
ms = (time.perf_counter() - t0) * 1e3
after_import = sorted(sys.modules)
touched = None
if len(sys.argv) > 1:
    for name in sys.argv[1].split(","):
        getattr(kjit, name)
    touched = sorted(sys.modules)
if len(sys.argv) > 2:
    obj = kjit.compile("extern \"C\" __global__ void k(float* x) { x[0] = 1; }",
                       arch="sm_90", target=sys.argv[2])
    assert obj.entry_points == ("k",)
try:
    maps = open("/proc/self/maps").read()
except OSError:
    maps = ""
print(json.dumps({"ms": ms, "modules": after_import, "touched": touched,
                  "libcuda": "libcuda" in maps, "modules_end": sorted(sys.modules)}))
'''


def probe(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_import_is_fast():
    times = [probe()["ms"] for _ in range(5)]
    assert statistics.median(times) < BUDGET_MS, f"import kjit took {times} ms"


def test_import_loads_no_driver_bindings_numpy_or_libcuda():
    result = probe()
    loaded = set(result["modules"])
    for heavy in ("cuda.bindings.driver", "cuda.bindings.runtime", "cuda.bindings.nvrtc",
                  "numpy", "click", "diskcache"):
        assert heavy not in loaded, f"import kjit imported {heavy}"
    assert not result["libcuda"]


def test_public_names_load_lazily_without_the_driver():
    result = probe("compile,CompileOptions,ObjectCode,CompileError")
    touched = set(result["touched"])
    assert "kjit.compiler.options" in touched and "kjit.objectcode" in touched
    assert "cuda.bindings.driver" not in touched
    assert not result["libcuda"]


def test_compiling_with_an_explicit_arch_never_loads_libcuda():
    # NVRTC needs no driver: on a GPU machine this checks kjit does not load it anyway
    for target in ("ptx", "cubin"):
        result = probe("compile", target)
        assert not result["libcuda"], f"compiling to {target} loaded libcuda"


# The path from a fresh process to its first launch: compile (disk hit), load, get_function,
# an array, the argument packer. numpy costs more to import than all of kjit, so none of this
# may import it until the program itself uses numpy.
LAUNCH_PATH = r'''
import sys
import kjit
from kjit.runtime import module, kernel, memory, context, stream
from kjit.runtime.cdecl import parse_signatures
from kjit.runtime.params import Packer, layout, ptr
src = 'extern "C" __global__ void k(float* out, int n, float a, double d, unsigned char c) {}'
obj = kjit.compile(src, arch="sm_90")
sig = parse_signatures(obj.metadata["declarations"])["k"]
pk = Packer("k", layout([p.ctype for p in sig.params], [p.name for p in sig.params], None), 0)
arr = memory.DeviceArray(16, "float32", ptr=1 << 20, device=0)   # describes memory, allocates none
values = pk.convert_all((arr, 7, 2.5, 1e300, 255), [])
assert values == [1 << 20, 7, 2.5, 1e300, 255], values
assert arr.__cuda_array_interface__["typestr"] == "<f4" and arr.nbytes == 64
for bad, why in [((arr, 7.5, 2.5, 1.0, 1), "expected an integer"), ((arr, 7, 1e39, 1.0, 1), "overflows float"),
                 ((arr, 7, 2.5, 1.0, 256), "does not fit"), ((arr, 2**24 + 1, 2**24 + 1, 1.0, 1), "exactly")]:
    try:
        pk.convert_all(bad, [])
    except kjit.ArgumentError as exc:
        assert why in str(exc), (why, str(exc))
    else:
        raise AssertionError(f"{bad} was accepted")
print("numpy" in sys.modules)
'''


def test_launch_path_imports_no_numpy(tmp_path):
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path))
    for _ in range(2):   # a miss, then the disk hit a fresh process sees
        proc = subprocess.run([sys.executable, "-c", LAUNCH_PATH], capture_output=True, text=True,
                              cwd=REPO, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "False", "the launch path imported numpy"


def test_dtype_table_agrees_with_numpy():
    import numpy as np
    from kjit.runtime import dtypes
    for spelling in list(dtypes._BY_STRING) + list(dtypes._BY_PYTHON_TYPE):
        typestr, itemsize, _ = dtypes.resolve(spelling)
        assert (typestr, itemsize) == (np.dtype(spelling).str, np.dtype(spelling).itemsize), spelling
    # what the table lacks goes to numpy, structure included
    rec = np.dtype([("a", "<f4"), ("b", "<i8")])
    assert dtypes.resolve(rec) == (rec.str, rec.itemsize, rec)
    assert dtypes.resolve(np.float32)[:2] == ("<f4", 4)


DISK_HIT = r'''
import json, sys
import kjit
obj = kjit.compile('extern "C" __global__ void k(float* o) { o[0] = 1.0f; }', arch="sm_90")
print(json.dumps([obj.cache_hit, sorted(m for m in sys.argv[1:] if m in sys.modules)]))
'''

# What a fresh process's disk hit has no use for, and what each would cost it (dev machine):
# the cache's writer (diskcache, pickle), numpy, `inspect` (dataclasses import it, ~9 ms),
# OpenSSL through hashlib (~2.5 ms; kjit.hashing), the binary readers (~2.5 ms), the compiler
# itself, cuda.bindings, and sqlite3's Python layer (its date adapters import datetime).
NOT_ON_A_HIT = ["diskcache", "pickle", "numpy", "inspect", "dataclasses", "kjit.formats.elf",
                "kjit.formats.sniff", "kjit.compiler.declarations", "kjit.compiler.nvrtc", "cuda.bindings",
                "sqlite3", "datetime", "kjit.compiler.keys.portable", "kjit.compiler.keys.roots",
                "kjit.compiler.keys.observe", "kjit.compiler.keys._observe"]


def test_a_disk_hit_imports_only_what_it_uses(tmp_path):
    """A fresh process whose compile hits the disk cache reads the entry with plain SQLite and
    rebuilds the ObjectCode from it: it imports none of NOT_ON_A_HIT (a miss does)."""
    from kjit import hashing
    watched = NOT_ON_A_HIT + (["hashlib"] if hashing._builtin_sha256 is not None else [])
    env = dict(os.environ, KJIT_CACHE_DIR=str(tmp_path))
    seen = []
    for _ in range(2):   # a miss (writes through diskcache), then a fresh process's disk hit
        proc = subprocess.run([sys.executable, "-c", DISK_HIT, *watched], capture_output=True,
                              text=True, cwd=REPO, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        seen.append(json.loads(proc.stdout))
    (miss_hit, miss_mods), (hit, hit_mods) = seen
    assert miss_hit is False and {"diskcache", "pickle", "kjit.compiler.nvrtc"} <= set(miss_mods)
    assert hit is True and hit_mods == []


def test_autotune_loads_no_cache_administration():
    """`@kjit.autotune` reads and writes records through the lookup; the `kjit tune` listing
    and clearing (kjit.cache's admin, diskcache, sqlite3) load only when asked for."""
    code = ("import sys, kjit, kjit.tune; "
            "print([m for m in ('kjit.cache.admin', 'diskcache', 'sqlite3') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=True).stdout
    assert out.strip() == "[]", out
