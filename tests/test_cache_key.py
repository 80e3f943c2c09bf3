"""The compile key: every ingredient that can change the output misses, nothing else does.
Header edits at depth miss, a touch hits. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
import time

import pytest

import kjit
import kjit.cache
from kjit.cache import key as key_mod
from kjit.compiler import cached as compiled
from kjit.compiler.keys import identity
from kjit.compiler.keys import description as compile_keys
from kjit.cache.disk import CacheWarning
from kjit.compiler.keys import includes

KERNEL = r'''
extern "C" __global__ void scale(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= FACTOR;
}
'''
SRC = "#define FACTOR 2.0f\n" + KERNEL


def ckey(source=SRC, **kw):
    kw.setdefault("arch", "sm_90")
    return compiled.compile_key(source, **kw)


def old(path, age=3600):
    """Give a file an mtime in the past, as files in a real tree have (trusted by stat)."""
    t = time.time() - age
    os.utime(path, (t, t))


# --- hits and misses for every ingredient (with real compiles) -------------------------------
def test_repeat_hits_and_returns_same_binary():
    a = kjit.compile(SRC, arch="sm_90")
    b = kjit.compile(SRC, arch="sm_90")
    assert (a.cache_hit, b.cache_hit) == (False, True)
    assert a.code == b.code and b.entry_points == ("scale",)


def test_source_edit_misses():
    kjit.compile(SRC, arch="sm_90")
    other = kjit.compile(SRC.replace("2.0f", "3.0f"), arch="sm_90")
    assert other.cache_hit is False


def test_arch_and_target_miss():
    base = kjit.compile(SRC, arch="sm_90")
    assert kjit.compile(SRC, arch="sm_80").cache_hit is False
    ptx = kjit.compile(SRC, arch="compute_90", target="ptx")
    assert ptx.cache_hit is False and ptx.kind == "ptx"
    assert kjit.compile(SRC, arch="sm_90", target="ltoir").cache_hit is False
    assert kjit.compile(SRC, arch="sm_90").code == base.code


def test_equivalent_spellings_hit():
    """Options are keyed after normalisation: the same compile spelled differently hits."""
    a = kjit.compile(KERNEL, arch="sm_90", options=kjit.CompileOptions(defines={"FACTOR": "2.0f"}))
    b = kjit.compile(KERNEL, arch="SM_90", options=kjit.CompileOptions(defines=["FACTOR=2.0f"]))
    assert (a.cache_hit, b.cache_hit) == (False, True)


@pytest.mark.parametrize("change", [
    dict(std="c++20"), dict(defines={"EXTRA": "1"}), dict(fast_math=True), dict(line_info=True),
    dict(debug=True), dict(max_registers=32), dict(relocatable=True), dict(extra=["-lineinfo"]),
    dict(headers={"unused.h": "int x;"}),
])
def test_every_option_changes_the_key(change):
    assert ckey(options=kjit.CompileOptions(**change)) != ckey()


def test_option_change_misses_for_real():
    kjit.compile(SRC, arch="sm_90")
    assert kjit.compile(SRC, arch="sm_90", options=kjit.CompileOptions(max_registers=32)).cache_hit is False


def test_name_expressions_and_name_change_the_key(template_src):
    a = kjit.compile(template_src, arch="sm_90", name_expressions=["axpy<float>"])
    b = kjit.compile(template_src, arch="sm_90", name_expressions=["axpy<double>"])
    c = kjit.compile(template_src, arch="sm_90", name_expressions=["axpy<float>"])
    assert (a.cache_hit, b.cache_hit, c.cache_hit) == (False, False, True)
    assert c.symbols == a.symbols and "axpy<float>" in c.symbols   # symbol maps are stored
    assert ckey(name="a.cu") != ckey(name="b.cu")


def test_compiler_version_and_schema_change_the_key(monkeypatch):
    base = ckey()
    monkeypatch.setattr(compile_keys, "compiler_identity", lambda backend: "nvrtc 99.9")
    assert ckey() != base
    monkeypatch.undo()
    monkeypatch.setattr(key_mod, "SCHEMA_VERSION", key_mod.SCHEMA_VERSION + 1)
    assert ckey() != base


def test_compiler_identity_names_the_wheel():
    from importlib.metadata import version
    from kjit.compiler import nvrtc
    ident = identity.compiler_identity("cuda")
    major, minor = nvrtc.version()
    wheel = "nvidia-cuda-nvrtc" if major >= 13 else f"nvidia-cuda-nvrtc-cu{major}"
    assert ident.startswith(f"nvrtc {major}.{minor} ") and f"({wheel} {version(wheel)})" in ident


def test_keyed_env_var_misses(monkeypatch):
    kjit.compile(SRC, arch="sm_90")
    monkeypatch.setenv("NVVM_IR_VER_CHK", "0")
    assert kjit.compile(SRC, arch="sm_90").cache_hit is False
    monkeypatch.delenv("NVVM_IR_VER_CHK")
    assert kjit.compile(SRC, arch="sm_90").cache_hit is True


def test_unkeyed_env_var_hits(monkeypatch):
    kjit.compile(SRC, arch="sm_90")
    monkeypatch.setenv("NVRTC_DISABLE_PCH", "1")  # speed only, not output
    assert kjit.compile(SRC, arch="sm_90").cache_hit is True


# --- headers ------------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """inc/top.h -> inc/mid/middle.h -> inc/mid/deep/leaf.h (quoted, relative to each includer)."""
    inc = tmp_path / "inc"
    (inc / "mid" / "deep").mkdir(parents=True)
    (inc / "top.h").write_text('#include "mid/middle.h"\n')
    (inc / "mid" / "middle.h").write_text('#include "deep/leaf.h"\n')
    (inc / "mid" / "deep" / "leaf.h").write_text("#define FACTOR 2.0f\n")
    for p in [*inc.rglob("*"), inc]:
        old(p)
    return inc


HDR_SRC = "#include <top.h>\n" + KERNEL


def test_resolution_reaches_every_level(tree):
    res = includes.resolve(HDR_SRC, name="k.cu", include_dirs=[str(tree)], headers={})
    assert [os.path.relpath(p, tree) for kind, p, _ in res.deps] == \
        ["top.h", "mid/middle.h", "mid/deep/leaf.h"]


@pytest.mark.parametrize("fresh_edit", [False, True], ids=["old-file", "just-written"])
def test_header_edit_two_levels_deep_misses(tree, fresh_edit):
    opts = kjit.CompileOptions(include_dirs=[str(tree)])
    a = kjit.compile(HDR_SRC, arch="sm_90", options=opts)
    assert kjit.compile(HDR_SRC, arch="sm_90", options=opts).cache_hit is True
    leaf = tree / "mid" / "deep" / "leaf.h"
    leaf.write_text("#define FACTOR 3.0f\n")          # same size, different content
    if not fresh_edit:
        old(leaf, 1800)                                 # different, still old, mtime
    b = kjit.compile(HDR_SRC, arch="sm_90", options=opts)
    assert b.cache_hit is False and b.code != a.code
    leaf.write_text("#define FACTOR 2.0f\n")            # back to the first content: a hit
    assert kjit.compile(HDR_SRC, arch="sm_90", options=opts).code == a.code


def test_touch_hits(tree):
    opts = kjit.CompileOptions(include_dirs=[str(tree)])
    kjit.compile(HDR_SRC, arch="sm_90", options=opts)
    for p in tree.rglob("*.h"):
        p.touch()
    assert kjit.compile(HDR_SRC, arch="sm_90", options=opts).cache_hit is True
    # and in a fresh process's view (memo dropped) too
    compiled._memo.clear()
    includes._file_memo.clear()
    assert kjit.compile(HDR_SRC, arch="sm_90", options=opts).cache_hit is True


def test_new_header_shadowing_an_old_one_misses(tree, tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    old(first)
    opts = kjit.CompileOptions(include_dirs=[str(first), str(tree)])
    kjit.compile(HDR_SRC, arch="sm_90", options=opts)
    (first / "top.h").write_text("#define FACTOR 5.0f\n")  # now found before inc/top.h
    assert kjit.compile(HDR_SRC, arch="sm_90", options=opts).cache_hit is False


def test_in_memory_header_edit_at_depth_misses():
    src = '#include "a.h"\n' + KERNEL
    h1 = {"a.h": '#include "b.h"\n', "b.h": "#define FACTOR 2.0f\n"}
    h2 = {"a.h": '#include "b.h"\n', "b.h": "#define FACTOR 4.0f\n"}
    a = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(headers=h1))
    b = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(headers=h2))
    c = kjit.compile(src, arch="sm_90", options=kjit.CompileOptions(headers=dict(h1)))
    assert (a.cache_hit, b.cache_hit, c.cache_hit) == (False, False, True)


def test_mutating_a_headers_dict_misses():
    src = '#include "a.h"\n' + KERNEL
    opts = kjit.CompileOptions(headers={"a.h": "#define FACTOR 2.0f\n"})
    kjit.compile(src, arch="sm_90", options=opts)
    opts.headers["a.h"] = "#define FACTOR 7.0f\n"
    assert kjit.compile(src, arch="sm_90", options=opts).cache_hit is False


def test_quoted_include_from_the_current_directory(tmp_path, monkeypatch):
    """NVRTC looks for the main source's "quoted" includes in the current directory."""
    for d, val in (("one", "2.0f"), ("two", "3.0f")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "f.h").write_text(f"#define FACTOR {val}\n")
    src = '#include "f.h"\n' + KERNEL
    monkeypatch.chdir(tmp_path / "one")
    a = kjit.compile(src, arch="sm_90")
    monkeypatch.chdir(tmp_path / "two")
    b = kjit.compile(src, arch="sm_90")
    assert (a.cache_hit, b.cache_hit) == (False, False) and a.code != b.code


def test_computed_include_through_a_define(tree):
    src = '#define HDR "top.h"\n#include HDR\n' + KERNEL
    res = includes.resolve(src, name="k.cu", include_dirs=[str(tree)], headers={})
    assert len(res.deps) == 3


def test_unresolvable_computed_include_is_cached_when_observed(tree):
    from kjit.compiler.keys import observe
    if not observe.available():
        pytest.skip("the compile observer is not built")
    src = "#define CAT(a) a\n#include CAT(<top.h>)\n" + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(tree)])
    assert kjit.compile(src, arch="sm_90", options=opts).cache_hit is False
    assert kjit.compile(src, arch="sm_90", options=opts).cache_hit is True


def test_computed_include_compiles_uncached_without_the_observer(tree, monkeypatch):
    from kjit.compiler import cached
    monkeypatch.setenv("KJIT_OBSERVE", "0")  # no observer: no compile that reads headers is cached
    monkeypatch.setattr(cached, "_warned", set())
    src = "#define CAT(a) a\n#include CAT(<top.h>)\n" + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(tree)])
    with pytest.warns(CacheWarning, match="KJIT_OBSERVE=0"):
        obj = kjit.compile(src, arch="sm_90", options=opts)
    assert obj.cache_hit is None


def test_has_include_is_watched(tmp_path):
    old(tmp_path)
    src = "#if __has_include(<opt.h>)\n#include <opt.h>\n#else\n#define FACTOR 2.0f\n#endif\n" + KERNEL
    opts = kjit.CompileOptions(include_dirs=[str(tmp_path)])
    assert kjit.compile(src, arch="sm_90", options=opts).cache_hit is False
    (tmp_path / "opt.h").write_text("#define FACTOR 9.0f\n")
    assert kjit.compile(src, arch="sm_90", options=opts).cache_hit is False


def test_builtin_and_missing_headers_are_listed_not_fatal():
    res = includes.resolve("#include <cuda/std/cstdint>\n", name="k.cu", include_dirs=[], headers={})
    assert res.missing == ["cuda/std/cstdint"] and res.deps == []


def test_in_process_repeat_is_microseconds(tree):
    opts = kjit.CompileOptions(include_dirs=[str(tree)])
    kjit.compile(HDR_SRC, arch="sm_90", options=opts)
    n = 2000
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            kjit.compile(HDR_SRC, arch="sm_90", options=opts)
        best = min(best, (time.perf_counter() - t0) / n)
    assert best < 100e-6, f"{best * 1e6:.1f} µs per cached compile"   # ~5-10 µs measured
