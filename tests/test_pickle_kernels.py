"""What crosses processes by pickle (multiprocessing, Ray, Dask): an @kjit.kernel function, by
reference as a function is, with its specializations; a loaded Module or Kernel refuses and
says to send its code (tests/test_migration_api.py covers ObjectCode and LinkResult)."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import kjit
from kjit.errors import ArgumentError


@kjit.kernel
def scale(T="float", factor=2):
    return (f'extern "C" __global__ void scale({T}* x, int n) '
            f'{{ int i = threadIdx.x; if (i < n) x[i] *= {factor}; }}')


def test_a_kernel_function_and_its_specializations_pickle():
    assert pickle.loads(pickle.dumps(scale)) is scale
    double = scale.specialize(T="double", factor=3)
    back = pickle.loads(pickle.dumps(double))
    assert back is double and back.params == {"T": "double", "factor": 3}
    assert back.source() == double.source()


def test_a_kernel_function_reaches_another_process_and_compiles_there(tmp_path):
    mod = tmp_path / "user_kernels.py"
    mod.write_text("import kjit\n\n@kjit.kernel\ndef fill(v=7):\n"
                   "    return f'extern \"C\" __global__ void fill(int* p) {{ *p = {v}; }}'\n")
    path = os.pathsep.join([str(tmp_path), str(Path(kjit.__file__).parents[1]),
                            os.environ.get("PYTHONPATH", "")])
    blob = subprocess.run(
        [sys.executable, "-c", "import pickle, sys, user_kernels; "
         "sys.stdout.buffer.write(pickle.dumps(user_kernels.fill.specialize(v=9)))"],
        capture_output=True, check=True, env={**os.environ, "PYTHONPATH": path}).stdout
    out = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; f = pickle.loads(sys.stdin.buffer.read()); "
         "obj = f.compile('sm_90'); print(f.params, obj.entry_points)"],
        input=blob, capture_output=True, check=True, env={**os.environ, "PYTHONPATH": path}).stdout
    assert out.decode().split() == ["{'v':", "9}", "('fill',)"]


def test_a_loaded_kernel_refuses_pickle_and_says_what_to_send():
    from kjit.runtime.kernel import Kernel
    k = Kernel.__new__(Kernel)   # no driver here: the refusal needs none
    k.name = "saxpy"
    with pytest.raises(ArgumentError, match=r"module\.object.*kjit\.load\(code\)\.get_function\('saxpy'\)"):
        pickle.dumps(k)
