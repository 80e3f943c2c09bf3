"""benchmarks/launch_lines.py: the count of what a launch runs in kjit's launch extension, under
callgrind with a libcuda that does nothing (no GPU needed)."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("kjit.runtime._launch", reason="kjit's launch extension is not built here")
if not shutil.which("valgrind"):
    pytest.skip("valgrind is not installed", allow_module_level=True)


def _cuda_h() -> bool:
    from pathlib import Path

    from kjit.compiler import toolkit_headers
    cudart = toolkit_headers.located().get("cudart")
    return bool(cudart) and (Path(cudart) / "cuda.h").is_file()


if not _cuda_h():
    pytest.skip("cuda.h is not beside the CUDA runtime headers (Python's floor is built against it)",
                allow_module_level=True)


def test_the_launchers_path_is_counted_beside_pythons_floor(monkeypatch):
    from benchmarks import launch_lines
    monkeypatch.setattr(launch_lines, "ARGS", (1, 16))
    monkeypatch.setattr(launch_lines, "LAUNCHES", 2000)
    res = launch_lines.run()
    floor, launcher = res["floor"], res["launcher"]
    for n in (1, 16):
        # the floor calls cuLaunchKernel and returns: a few dozen instructions, a line or two
        assert 5 <= floor[n]["instructions"] <= 60 and 1 <= floor[n]["lines"] <= 4
        # the launcher checks, packs and picks the stream too, on a path laid out together
        assert floor[n]["instructions"] < launcher[n]["instructions"] <= 400
        assert launcher[n]["lines"] <= 16
    # the same objects again: sixteen arguments cost a few instructions each, no new lines
    assert launcher[16]["instructions"] - launcher[1]["instructions"] <= 15 * 10
    assert launcher[16]["lines"] <= launcher[1]["lines"] + 2
