"""Every example runs on the GPU and checks its own results."""
import runpy
import sys
from pathlib import Path

import pytest
from cupy_family import import_cupy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["saxpy.py", "templates.py", "constant_memory.py", "torch_cupy.py"])
def test_example_runs(name, capsys):
    if "cupy" in name:
        import_cupy()
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    assert "ok" in capsys.readouterr().out
