"""`import kjit` is cheap and touches no driver: measured in fresh interpreters."""
from __future__ import annotations

import json
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
    assert "kjit.compiler.api" in touched and "kjit.objectcode" in touched
    assert "cuda.bindings.driver" not in touched
    assert not result["libcuda"]


def test_compiling_with_an_explicit_arch_never_loads_libcuda():
    # NVRTC needs no driver: on a GPU machine this checks kjit does not load it anyway
    for target in ("ptx", "cubin"):
        result = probe("compile", target)
        assert not result["libcuda"], f"compiling to {target} loaded libcuda"
