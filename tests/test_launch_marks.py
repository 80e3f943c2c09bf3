"""The launcher's step marks (benchmarks/launch_marks.py) build and load in place of the
extension: the hooks in kjit/runtime/_launch.c compile to nothing in the shipped build and to
timestamps in the marked one."""
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_marked_launcher_builds_and_replaces_the_extension(tmp_path):
    _launch = pytest.importorskip("kjit.runtime._launch", reason="C launch call not built here")
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to build the marked launcher with")
    assert not hasattr(_launch, "marks")   # the shipped build has no marks
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from benchmarks.launch_marks import build_marked
        ext = build_marked(Path({str(tmp_path)!r}))
        from kjit.runtime.libcuda import c_function
        assert c_function("marks") is ext.marks
        assert ext.marks() == (0, 0, 0, (0, 0, 0, 0, 0))
        assert ext.marks_cost(1000) > 0
        assert c_function("launcher") is not None
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"
