"""kjit.compile reads as what it does: make the request, derive the key, look it up or compile.
On every kind of miss the compiler is called within a handful of kjit frames of kjit.compile,
and nothing on the way is worked out twice."""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import kjit
from kjit.compiler import cached, include_path

KJIT_DIR = str(Path(kjit.__file__).resolve().parent) + os.sep
MAX_FRAMES = 5
KERNEL = 'extern "C" __global__ void k(float* o) { o[0] = VAL; }\n'


@pytest.fixture
def nvrtc_calls(monkeypatch):
    """Each nvrtcCompileProgram call's kjit frames, innermost first, up to kjit.compile."""
    from cuda.bindings import nvrtc
    # a precompiled header's own compile of the prologue is another NVRTC call (test_pch.py)
    monkeypatch.setenv("KJIT_PCH", "0")
    real = nvrtc.nvrtcCompileProgram
    calls: list[list[str]] = []

    def spy(*args):
        frames = []
        for f in inspect.stack()[1:]:
            if not os.path.abspath(f.filename).startswith(KJIT_DIR):
                break   # the caller of kjit.compile: the test
            frames.append(f"{os.path.relpath(f.filename, KJIT_DIR)}:{f.function}")
        calls.append(frames)
        return real(*args)
    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", spy)
    return calls


def _src(tmp_path: Path, val: str, observe: str = "1") -> tuple[str, dict]:
    """A kernel whose constant comes from a header; without the observer (KJIT_OBSERVE=0) one
    that reads no header, as only those are cached there (docs/headers.md)."""
    if observe == "0":
        return KERNEL.replace("VAL", val) + f"// {tmp_path.name}\n", {}
    (tmp_path / "v.h").write_text(f"#define VAL {val}\n")
    return '#include "v.h"\n' + KERNEL, {"options": kjit.CompileOptions(include_dirs=[str(tmp_path)])}


def _one_compile(calls: list[list[str]]) -> list[str]:
    assert len(calls) == 1, calls
    frames = calls.pop()
    assert frames[0] == "compiler/nvrtc.py:compile_source" and frames[-1] == "__init__.py:compile"
    return frames


@pytest.mark.parametrize("observe", ["1", "0"], ids=["observed", "unobserved"])
def test_a_miss_reaches_the_compiler_in_a_handful_of_frames(tmp_path, monkeypatch, nvrtc_calls, observe):
    monkeypatch.setenv("KJIT_OBSERVE", observe)
    src, kw = _src(tmp_path, "1.0f", observe)
    obj = kjit.compile(src, arch="sm_90", target="ptx", **kw)             # a new kernel
    assert obj.cache_hit is False
    assert len(_one_compile(nvrtc_calls)) <= MAX_FRAMES
    assert kjit.compile(src, arch="sm_90", target="ptx", **kw).cache_hit is True
    assert nvrtc_calls == []

    kjit.cache.clear()                                                     # its entry is gone
    again = kjit.compile(src, arch="sm_90", target="ptx", **kw)
    assert again.cache_hit is False and again.code == obj.code
    assert len(_one_compile(nvrtc_calls)) <= MAX_FRAMES

    off = kjit.compile(src + "// off\n", arch="sm_90", target="ptx", cache=False, **kw)
    assert off.cache_hit is None
    assert len(_one_compile(nvrtc_calls)) <= MAX_FRAMES


@pytest.mark.parametrize("observe", ["1", "0"], ids=["observed", "unobserved"])
def test_the_search_path_is_worked_out_once_per_miss(tmp_path, monkeypatch, observe):
    monkeypatch.setenv("KJIT_OBSERVE", observe)
    real = include_path.for_options
    calls = []

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    monkeypatch.setattr(include_path, "for_options", counting)
    src, kw = _src(tmp_path, "2.0f", observe)
    assert kjit.compile(src, arch="sm_90", target="ptx", **kw).cache_hit is False
    assert len(calls) == 1
    kjit.cache.clear()
    cached._memo.clear()                                   # as a fresh process: keyed anew
    assert kjit.compile(src, arch="sm_90", target="ptx", **kw).cache_hit is False
    assert len(calls) == 2


def test_the_compile_uncached_function_is_defined_once():
    """One function runs the compiler for a request (kjit.compiler.cached.compile_uncached)."""
    import kjit.compiler as package
    defined = [p.name for p in Path(package.__file__).parent.glob("*.py")
               if "def compile_uncached(" in p.read_text()]
    assert defined == ["cached.py"]


@pytest.fixture
def work_counts(monkeypatch):
    """How often a miss describes the request, hashes the source and an in-memory header, and
    describes the options."""
    import sys

    from kjit import hashing
    from kjit.compiler import options
    from kjit.compiler.keys import description as key
    monkeypatch.setenv("KJIT_PCH", "0")   # a precompiled header's compile is a request of its own
    counts = {"describe": 0, "source": 0, "header": 0, "options": 0}
    texts: dict = {}
    real_sha, real_describe, real_options = hashing.sha256, key.describe, options.CompileOptions.describe

    def sha256(data=b""):
        for what, text in texts.items():
            if data in (text, text.encode()):
                counts[what] += 1
        return real_sha(data)

    def describe(*args):
        counts["describe"] += 1
        return real_describe(*args)

    def describe_options(self):
        counts["options"] += 1
        return real_options(self)
    for mod in [m for n, m in sys.modules.items() if n.startswith("kjit")]:
        for attr in ("sha256", "_sha256"):
            if getattr(mod, attr, None) is real_sha:
                monkeypatch.setattr(mod, attr, sha256)
    monkeypatch.setattr(key, "describe", describe)
    monkeypatch.setattr(options.CompileOptions, "describe", describe_options)
    return counts, texts


@pytest.mark.parametrize("observe", ["1", "0"], ids=["observed", "unobserved"])
def test_a_miss_describes_the_request_once(tmp_path, monkeypatch, work_counts, observe):
    from kjit.compiler.keys import observe as observer
    if observe == "1" and not observer.available("cuda"):
        pytest.skip("the compile observer (compiler/keys/_observe.c) is not built here")
    monkeypatch.setenv("KJIT_OBSERVE", observe)
    counts, texts = work_counts
    header = f"#define VAL 5.0f // {tmp_path.name}\n"
    src = '#include "mem.h"\n' + KERNEL
    headers = {"mem.h": header}
    once = {"describe": 1, "source": 1, "header": 1, "options": 1}
    if observe == "0":   # only a compile without headers is cached there
        src, headers = KERNEL.replace("VAL", f"5.0f + {len(tmp_path.name)}"), {}
        once = {"describe": 1, "source": 1, "options": 1}
    texts.update(source=src, header=header)
    kw = dict(arch="sm_90", target="ptx", options=kjit.CompileOptions(headers=headers))
    obj = kjit.compile(src, **kw)
    assert obj.cache_hit is False
    assert {k: counts[k] for k in once} == once
    import hashlib
    [entry] = kjit.cache.ls()             # the entry still names its source's digest
    assert kjit.cache.show(entry["key"])["source_sha256"] == hashlib.sha256(src.encode()).hexdigest()

    kjit.cache.clear()                    # its entry gone: compiled again under the known key
    assert kjit.compile(src, **kw).cache_hit is False
    assert {k: counts[k] for k in once} == once


@pytest.mark.parametrize("arch", [None, "sm_90"], ids=["device-arch", "sm_90"])
def test_an_unknown_backend_is_named_before_anything_else(monkeypatch, arch):
    """A bad backend is the error, with or without the cache, whether or not an arch could be
    found (no device here, no $KJIT_ARCH)."""
    monkeypatch.delenv("KJIT_ARCH", raising=False)
    messages = []
    for cache in (True, False):
        with pytest.raises(kjit.InvalidOptionError) as info:
            kjit.compile(KERNEL.replace("VAL", "1.0f"), arch=arch, backend="opencl", cache=cache)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "backend='opencl' is not one of cuda, hip" in messages[0]


def test_compile_many_validates_each_item_once(tmp_path, monkeypatch):
    """compile_many's items are validated before anything compiles, and not again to compile."""
    from kjit.compiler import request
    monkeypatch.setenv("KJIT_PCH", "0")
    real = request.make_request
    made = []

    def counting(source, **kwargs):
        made.append(source)
        return real(source, **kwargs)
    monkeypatch.setattr(request, "make_request", counting)
    monkeypatch.setattr(cached, "make_request", counting)
    sources = [KERNEL.replace("VAL", f"{i}.5f") for i in range(3)]
    items = sources[:2] + [{"source": sources[2], "cache": False}]
    objs = kjit.compile_many(items, arch="sm_90", target="ptx", jobs=1)   # misses, compiled here
    assert [o.cache_hit for o in objs] == [False, False, None]
    assert sorted(made) == sorted(sources)
    made.clear()
    cached._memo.clear()                                   # hits found by deriving the key again
    assert [o.cache_hit for o in kjit.compile_many(sources[:2], arch="sm_90", target="ptx")] == [True, True]
    assert sorted(made) == sorted(sources[:2])


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "uncached"])
def test_the_arch_is_resolved_once(tmp_path, monkeypatch, cache):
    """kjit.compile(arch=None) asks for the device's arch once; the request takes it as it is."""
    from kjit import arch
    monkeypatch.setenv("KJIT_ARCH", "sm_90")
    monkeypatch.setattr(arch, "device_arch", lambda: None)   # no device: $KJIT_ARCH decides
    real, asked = arch.resolve, []

    def counting(given, backend="cuda"):
        asked.append(given)
        return real(given, backend)
    monkeypatch.setattr(arch, "resolve", counting)
    obj = kjit.compile(KERNEL.replace("VAL", f"{len(tmp_path.name)}.25f"), cache=cache)
    assert obj.arch == "sm_90"
    assert [a for a in asked if not isinstance(a, arch.Arch)] == [None]


def test_the_compile_path_knows_nothing_of_compile_many():
    """compile_many defers a compile through the seam the compile path offers
    (cached.before_compile); its own names stay in many.py."""
    import kjit.compiler as package
    root = Path(package.__file__).parent
    naming = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                    if any(w in p.read_text() for w in ("Deferred", "deferring")))
    assert naming == ["many.py"]
