"""cuda-gdb shows a kjit kernel's own source lines, for a kernel that came from the cache: a
first process compiles it with line_info, a second one, under cuda-gdb, hits the cache,
launches it and stops in it; `list` there prints the user's lines from the kept file
(docs/debugging.md)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import sys
import numpy as np
import kjit

SRC = """extern "C" __global__ void kjit_debug_probe(int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int probe_marker_value = i * 7 + 3;
    if (i < n) out[i] = probe_marker_value;
}
"""
obj = kjit.compile(SRC, options=kjit.CompileOptions(debug=True))
print("cache_hit=%s" % obj.cache_hit, flush=True)
k = kjit.load(obj).get_function("kjit_debug_probe")
out = kjit.zeros(32, np.int32)
k[1, 32](out, 32)
kjit.synchronize()
assert out.get()[5] == 38
print("launched", flush=True)
'''


def _env(cache: Path) -> dict:
    return dict(os.environ, KJIT_CACHE_DIR=str(cache),
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _cuda_gdb() -> str | None:
    found = shutil.which("cuda-gdb")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and os.path.isfile(os.path.join(base, "bin", "cuda-gdb")):
            return os.path.join(base, "bin", "cuda-gdb")
    return None


# how the debugger is told to stop in a kernel that is loaded while Python runs: at every
# launch, or at a breakpoint on its name, pending until the module is loaded
STOPS = {"break_on_launch": ["-ex", "set cuda break_on_launch application"],
         "named_breakpoint": ["-ex", "set breakpoint pending on", "-ex", "break kjit_debug_probe"]}


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_cuda_gdb_lists_the_source_of_a_kernel_from_the_cache(tmp_path, stop):
    gdb = _cuda_gdb()
    if gdb is None:
        pytest.skip("cuda-gdb is not installed here (CUDA toolkit's bin/ or PATH)")
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    cache = tmp_path / "cache"
    first = subprocess.run([sys.executable, str(script)], env=_env(cache), capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "cache_hit=False" in first.stdout
    kept = list((cache / "sources").rglob("kernel.cu"))
    assert len(kept) == 1
    # removed between the processes: the debugged one, a cache hit, must write it again
    os.chmod(kept[0], 0o644)
    kept[0].unlink()

    cmd = [gdb, "-batch", "-nx", *STOPS[stop],
           "-ex", "run",
           "-ex", "info line",
           "-ex", "list",
           "-ex", "kill",
           "--args", sys.executable, str(script)]
    out = subprocess.run(cmd, env=_env(cache), capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    text = out.stdout + out.stderr
    assert "cache_hit=True" in text, text[-4000:]
    assert "kjit_debug_probe" in text, text[-4000:]
    # the user's lines as `list` prints them (number, tab, text), read by cuda-gdb from the
    # kept file the line table names: the only file on disk that holds them
    assert re.search(r"^3\s+int probe_marker_value = i \* 7 \+ 3;", text, re.M), text[-4000:]
    assert kept[0].read_text().startswith('extern "C" __global__ void kjit_debug_probe')
