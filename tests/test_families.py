"""The two CUDA wheel families (kjit[cu13], kjit[cu12]): what kjit says when the driver is of an
older CUDA major than the wheels, or when no family is installed, and that each family finds
its own runtime headers and device runtime. The suite itself runs on both families in CI
(.ci/run); the GPU machine runs the GPU tests on both (docs/contributing.md)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from kjit import driver, families
from kjit.linker import devrt

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("drv, wheels, family", [(12040, "13.0.3", "cu12"), (12090, "13.5.0", "cu12")])
def test_a_cuda12_driver_with_cuda13_wheels_names_the_cu12_install(drv, wheels, family):
    text = families.family_mismatch(drv, wheels)
    assert text is not None
    assert f"CUDA {drv // 1000}.{drv % 1000 // 10}" in text and f"cuda-bindings {wheels}" in text
    assert f"pip install 'kjit[{family}]'" in text
    assert "580.65.06" in text          # or the driver that runs the installed family


@pytest.mark.parametrize("drv, wheels", [(13000, "13.5.0"), (13000, "12.9.10"), (12020, "12.9.10"),
                                         (13020, "13.0.1")])
def test_a_driver_of_the_same_or_a_newer_major_is_accepted(drv, wheels):
    # a minor version newer than the driver is bridged (PTX is linked to cubin by nvJitLink)
    assert families.family_mismatch(drv, wheels) is None


def test_a_driver_older_than_every_family_says_so():
    text = families.family_mismatch(11080, "12.9.10")
    assert "no kjit family supports it" in text and "525.60.13" in text


def test_the_families_in_pyproject_name_one_cuda_major_each():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    base = " ".join(meta["dependencies"])
    # nothing of either family in the base: `pip install 'kjit[cu12]'` must not pull CUDA 13
    assert "nvrtc" not in base and "nvjitlink" not in base and "nvfatbin" not in base
    for family, major in (("cu13", 13), ("cu12", 12)):
        reqs = extras[family]
        assert any(r.startswith("cuda-bindings") and f"<{major + 1}" in r for r in reqs), reqs
        for lib in ("nvrtc", "nvjitlink", "nvfatbin", "cuda-runtime"):
            assert any(lib in r for r in reqs), (family, lib)
    assert all("-cu12" in r for r in extras["cu12"] if r.startswith("nvidia-"))
    assert not any("-cu12" in r for r in extras["cu13"])


def test_each_family_links_its_own_device_runtime(monkeypatch, tmp_path):
    # the cu12 wheel puts it in nvidia/cuda_runtime/lib, the cu13 one in nvidia/cu13/lib;
    # nvJitLink 12 cannot read CUDA 13's objects, so neither takes the other's
    monkeypatch.delenv(devrt.ENV_DEVRT, raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    for sub in ("cu13", "cuda_runtime"):
        d = tmp_path / "nvidia" / sub / "lib"
        d.mkdir(parents=True)
        (d / "libcudadevrt.a").write_bytes(b"!<arch>\n")
    monkeypatch.setattr(devrt, "_search_dirs", lambda: [tmp_path])
    assert devrt.find(13) == tmp_path / "nvidia" / "cu13" / "lib" / "libcudadevrt.a"
    assert devrt.find(12) == tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudadevrt.a"
    (tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudadevrt.a").unlink()
    assert devrt.find(12) is None       # so require() names the cu12 wheel to install
    (tmp_path / "nvidia" / "cu13" / "lib" / "libcudadevrt.a").unlink()
    (tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudadevrt.a").write_bytes(b"!<arch>\n")
    assert devrt.find(13) is None


def test_the_cuda12_runtime_headers_come_first_on_the_cuda12_family(monkeypatch, tmp_path):
    # an environment moved from kjit[cu13] to kjit[cu12] keeps the CUDA 13 runtime wheel
    from kjit.compiler import toolkit_headers as th
    for sub in ("cu13/include", "cuda_runtime/include"):
        d = tmp_path / "nvidia" / sub
        d.mkdir(parents=True)
        (d / "cuda_runtime.h").write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    for version, want in (("12.9.10", "cuda_runtime"), ("13.5.0", "cu13")):
        monkeypatch.setattr(families, "package_version",
                            lambda dists, v=version: ("cuda-bindings", v) if "cuda-bindings" in dists else None)
        assert Path(th._on_sys_path("cudart", "cuda_runtime.h")).parent.name == want


NO_NVRTC = textwrap.dedent("""
    import cuda.pathfinder as pathfinder
    def not_found(name):   # what cuda.bindings meets where no NVRTC wheel is installed
        raise pathfinder.DynamicLibNotFoundError(f"Failure finding lib{name}.so")
    pathfinder.load_nvidia_dynamic_lib = not_found
    import kjit
    try:
        kjit.compile('extern "C" __global__ void f(float* x) { x[0] = 1; }', arch="sm_90")
    except kjit.KjitError as exc:
        print(exc)
""")


@pytest.mark.parametrize("facts_known", [False, True])
def test_no_nvrtc_installed_says_which_family_to_install(tmp_path, facts_known):
    # A plain `pip install kjit` brings cuda-bindings and no NVRTC. Also where an earlier
    # process (with NVRTC) left NVRTC's facts in the cache, so the compile is the first call.
    env = {**__import__("os").environ, "KJIT_CACHE_DIR": str(tmp_path / "cache")}
    if facts_known:
        subprocess.run([sys.executable, "-c", "import kjit; kjit.compile('__global__ void g(){}', "
                        "arch='sm_90')"], env=env, check=True, timeout=120)
    out = subprocess.run([sys.executable, "-c", NO_NVRTC], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    major = __import__("cuda.bindings").bindings.__version__.split(".")[0]
    assert "NVRTC is not installed" in out.stdout
    assert f"pip install 'kjit[cu{major}]'" in out.stdout, out.stdout


def test_a_library_of_the_other_family_is_named(monkeypatch):
    monkeypatch.setattr(families, "package_version", lambda dists: ("cuda-bindings", "12.9.10"))
    text = families.other_family_loaded("NVRTC", (13, 0))
    assert "cuda-bindings 12.9.10" in text and "NVRTC 13.0" in text and "CUDA 13 driver" in text
    assert families.other_family_loaded("NVRTC", (12, 6)) is None


def _include(root: Path, rel: str, version: int | None, crt: bool = False) -> Path:
    d = root / rel
    d.mkdir(parents=True)
    if version is not None:
        (d / "cuda_runtime_api.h").write_text(f"#define CUDART_VERSION {version}\n")
    if crt:
        (d / "crt").mkdir()
        (d / "crt" / "mma.h").write_text("")
    return d


def test_crt_never_comes_from_a_toolkit_of_another_cuda_major(monkeypatch, tmp_path):
    # CUDA 12 wheels beside a CUDA 13 toolkit (/usr/local/cuda): its include directory would
    # also answer cuda_fp6.h and the rest, which NVRTC 12 cannot parse
    from kjit.compiler import toolkit_headers as th
    cudart = _include(tmp_path / "site", "nvidia/cuda_runtime/include", 12090)
    toolkit13 = _include(tmp_path, "cuda-13.0/include", 13000, crt=True)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    # the family asked of a stand-in: the installed wheels, listed with this sys.path, would be
    # remembered for the rest of the process
    monkeypatch.setattr(families, "installed_family", lambda: (12, "12.9.10"))
    monkeypatch.setattr(th, "_toolkit_includes", lambda: [str(toolkit13)])
    th.crt_dir.cache_clear()
    try:
        assert th.crt_dir(str(cudart)) is None
        # the CUDA 12 family's own crt/: nvidia-cuda-nvcc-cu12's include directory
        nvcc = _include(tmp_path / "site", "nvidia/cuda_nvcc/include", None, crt=True)
        th.crt_dir.cache_clear()
        assert th.crt_dir(str(cudart)) == str(nvcc)
        # and a toolkit of the same major serves where no wheel does
        toolkit12 = _include(tmp_path, "cuda-12.9/include", 12090, crt=True)
        (nvcc / "crt" / "mma.h").unlink()
        monkeypatch.setattr(th, "_toolkit_includes", lambda: [str(toolkit13), str(toolkit12)])
        th.crt_dir.cache_clear()
        assert th.crt_dir(str(cudart)) == str(toolkit12)
    finally:
        th.crt_dir.cache_clear()


MIXED = textwrap.dedent("""
    import json
    import kjit
    from kjit.linker import nvjitlink as kjit_nvjitlink
    from cuda.bindings import nvrtc
    ptx = kjit.compile('extern "C" __global__ void f(float* x) { x[0] = 1; }', arch="sm_80",
                       target="ptx")
    kjit.link([ptx], arch="sm_80", backend="nvjitlink")
    print(json.dumps({"nvrtc": list(nvrtc.nvrtcVersion()[1:]),
                      "nvjitlink": list(kjit_nvjitlink.version())}))
""")


def _cu13_beside() -> bool:
    import site
    return any((Path(d) / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13").is_file()
               for d in site.getsitepackages())


@pytest.mark.skipif(not (__import__("cuda.bindings").bindings.__version__.startswith("12.")
                         and _cu13_beside()),
                    reason="needs the CUDA 12 family with a CUDA 13 NVRTC wheel left beside it")
def test_the_cuda12_family_loads_its_own_libraries_beside_cuda13_wheels(tmp_path):
    # an environment moved from kjit[cu13] to kjit[cu12] keeps the CUDA 13 NVRTC wheel, which
    # cuda.pathfinder would take first (libnvrtc.so.13 before .so.12)
    env = {**os.environ, "KJIT_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", MIXED], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = __import__("json").loads(out.stdout.splitlines()[-1])
    assert got["nvrtc"][0] == 12 and got["nvjitlink"][0] == 12, got
    assert "CompileWarning" not in out.stderr, out.stderr
