"""Header layouts users really have: PyTorch's runtime-header wheels (cuda_fp16.h, mma.h, no
crt/) beside a CUDA toolkit that has crt/, as on the GPU machine. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import kjit
from kjit.compiler import toolkit_headers

# the corpus's WMMA kernel: <mma.h> includes crt/mma.h
WMMA = (Path(__file__).parent / "corpus" / "wmma_gemm.cu").read_text()


def _split_layout(tmp_path: Path) -> tuple[Path, Path]:
    """(runtime headers without crt/, a toolkit root whose include/ has crt/), built from the
    installed headers with symlinks (crt/ from wherever this family's is: the CUDA 13 runtime
    wheel holds it, the CUDA 12 one does not)."""
    real = Path(toolkit_headers.located()["cudart"])
    crt = next((Path(d) / "crt" for d in toolkit_headers.dirs()
                if (Path(d) / toolkit_headers.CRT_ANCHOR).is_file()), None)
    if crt is None:
        pytest.skip("no crt/ is installed (no nvidia-cuda-crt wheel, no CUDA toolkit)")
    runtime = tmp_path / "torch-site" / "nvidia" / "cu13" / "include"
    runtime.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name not in ("crt", "cccl"):
            (runtime / entry.name).symlink_to(entry)
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "crt").symlink_to(crt)
    return runtime, toolkit


@pytest.fixture
def split_layout(tmp_path, monkeypatch):
    runtime, toolkit = _split_layout(tmp_path)
    cccl = toolkit_headers.located()["cccl"]
    wheel_dir = toolkit_headers._on_sys_path

    def on_sys_path(lib, anchor):  # only the runtime-header wheel: no crt/ anywhere on sys.path
        if anchor == toolkit_headers.CRT_ANCHOR:
            return None
        return wheel_dir(lib, anchor)

    monkeypatch.setattr(toolkit_headers, "_on_sys_path", on_sys_path)
    monkeypatch.setattr(toolkit_headers, "located", lambda: {"cccl": cccl, "cudart": str(runtime)})
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    toolkit_headers.crt_dir.cache_clear()
    yield runtime, toolkit
    toolkit_headers.crt_dir.cache_clear()


def test_crt_comes_from_the_toolkit_when_the_runtime_wheel_has_none(split_layout):
    runtime, toolkit = split_layout
    dirs = toolkit_headers.dirs()
    assert str(runtime) in dirs
    assert dirs[-1] == os.path.realpath(toolkit / "include")
    obj = kjit.compile(WMMA, arch="sm_80", target="cubin", cache=False)
    assert "wmma_gemm_16x16x16" in obj.entry_points


def test_crt_from_a_system_toolkit_without_cuda_home(split_layout, monkeypatch):
    runtime, toolkit = split_layout
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setattr(toolkit_headers, "SYSTEM_TOOLKITS", (str(toolkit),))
    toolkit_headers.crt_dir.cache_clear()
    assert toolkit_headers.dirs()[-1] == os.path.realpath(toolkit / "include")
    assert "wmma_gemm_16x16x16" in kjit.compile(WMMA, arch="sm_90", cache=False).entry_points


# --- keys that do not depend on where things are installed -----------------------------------
HEADERS = r'''
#include <cstdint>
#include <cuda_fp16.h>
extern "C" __global__ void scale(__half* x, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = __hmul(x[i], __float2half(2.0f));
}
'''
_PROBE = r'''
import json, sys, kjit
from kjit.compiler import nvrtc
compiles, compile_source = [], nvrtc.compile_source
nvrtc.compile_source = lambda *a, **k: compiles.append(1) or compile_source(*a, **k)
src = open(sys.argv[1]).read()
opts = kjit.CompileOptions(line_info=sys.argv[2] == "lineinfo")
obj = kjit.compile(src, arch="sm_90", options=opts)
from kjit.compiler import toolkit_headers
from kjit.compiler.cached import compile_key
from kjit.compiler.keys import observe
print(json.dumps({"hit": obj.cache_hit, "compiles": len(compiles), "observed": observe.available("cuda"), "kjit": kjit.__file__, "dirs": toolkit_headers.dirs(),
                  "key": compile_key(src, arch="sm_90", options=opts)}))
'''


def _wheel_dir(lib: str) -> str:
    """Where `lib`'s headers lie below site-packages in this environment."""
    d = toolkit_headers.located()[lib]
    return next(r for r in toolkit_headers.WHEEL_DIRS[lib] if d.endswith(os.sep + r))


def _environment(root: Path) -> Path:
    """A copy of kjit and of the header wheels' layout at `root` (files linked, directories
    real, so every path below `root` stays below it): each wheel directory at the place it
    has below site-packages (CUDA 13: CCCL inside the runtime headers' directory; CUDA 12:
    nvidia/cuda_runtime/include beside it)."""
    import shutil
    import kjit as pkg
    shutil.copytree(Path(pkg.__file__).parent, root / "kjit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheels = {_wheel_dir(lib): Path(d) for lib, d in toolkit_headers.located().items()}
    for rel in sorted(wheels, key=len):   # an enclosing directory first
        inc = root / rel
        inc.mkdir(parents=True, exist_ok=True)
        for entry in wheels[rel].iterdir():
            if f"{rel}/{entry.name}" not in wheels:   # a nested wheel directory stays real
                (inc / entry.name).symlink_to(entry)
    return root


def _probe(env: Path, src: Path, cache: Path, extra_env=None, mode="plain") -> dict:
    import json
    import subprocess
    import sys
    environ = dict(os.environ, PYTHONPATH=str(env), KJIT_CACHE_DIR=str(cache), **(extra_env or {}))
    out = subprocess.run([sys.executable, "-c", _PROBE, str(src), mode], env=environ, cwd=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_environments(tmp_path_factory):
    base = tmp_path_factory.mktemp("envs")
    src = base / "k.cu"
    src.write_text(HEADERS)
    return _environment(base / "venv-a"), _environment(base / "venv-b"), src


def test_two_environments_at_different_paths_share_one_disk_cache(two_environments, tmp_path):
    a, b, src = two_environments
    first = _probe(a, src, tmp_path / "cache")
    second = _probe(b, src, tmp_path / "cache")
    assert first["kjit"].startswith(str(a)) and second["kjit"].startswith(str(b))
    assert first["observed"] == second["observed"]
    assert all(d.startswith(str(a)) for d in first["dirs"][:2])
    assert not first["hit"] and second["hit"]
    assert first["compiles"] == 1 and second["compiles"] == 0      # keyed without compiling
    assert first["key"] == second["key"]


def test_line_info_keys_the_paths_it_puts_into_the_binary(two_environments, tmp_path):
    a, b, src = two_environments
    first = _probe(a, src, tmp_path / "cache", mode="lineinfo")
    second = _probe(b, src, tmp_path / "cache", mode="lineinfo")
    assert not first["hit"] and not second["hit"]
    assert first["key"] != second["key"]


def test_two_environments_share_the_remote_tier(two_environments, tmp_path, remote_env):
    a, b, src = two_environments
    signed = {"KJIT_REMOTE_CACHE_KEY": "a shared secret for this test"}
    first = _probe(a, src, tmp_path / "node-a", signed)
    second = _probe(b, src, tmp_path / "node-b", signed)      # another node's own disk cache
    assert not first["hit"] and second["hit"]
    assert first["compiles"] == 1 and second["compiles"] == 0


def test_another_installs_record_is_checked_not_trusted(two_environments, tmp_path):
    """The record another install filed names cuda_fp16.h with its content: here that header
    differs, so this install compiles (and gets another key) instead of taking the record."""
    a, _, src = two_environments
    c = _environment(tmp_path / "venv-c")
    header = c / _wheel_dir("cudart") / "cuda_fp16.h"
    text = header.read_text()
    header.unlink()
    header.write_text(text + "\n// a local patch\n")
    first = _probe(a, src, tmp_path / "cache")
    third = _probe(c, src, tmp_path / "cache")
    assert third["compiles"] == 1 and not third["hit"] and third["key"] != first["key"]
