"""Exact by observation: the cache key covers exactly what NVRTC read, so no way of naming or
finding a header returns a binary built from other contents. Each test edits a header the
kernel's constant comes from and checks the PTX holds the new constant. Changes over time
(a long-lived process, edits during a compile, untrusted cache directories) are in
test_observe_changes.py. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kjit
from kjit.compiler import cached as compiled
from kjit.compiler.keys import observe
from observe_helpers import KERNEL, edit_and_check, ptx, val, write

pytestmark = pytest.mark.skipif(not observe.available(), reason="the compile observer is not built")

REPO = Path(__file__).resolve().parents[1]


# --- 1. macros naming headers -----------------------------------------------------------------
@pytest.mark.parametrize("prologue,defines", [
    ('#ifndef HDR\n#define HDR "a.h"\n#endif\n', [("HDR", '"b.h"')]),                # -D wins
    ('#if 1\n#define HDR "b.h"\n#else\n#define HDR "a.h"\n#endif\n', []),           # #if branch
    ('#define HDR "a.h"\n#undef HDR\n#define HDR "b.h"\n', []),                      # redefined
    ('#include "names.h"\n', []),                                                    # from a header
    ('#define CAT(x, y) x##y\n#define STR(x) #x\n#define XSTR(x) STR(x)\n'
     '#define HDR XSTR(CAT(b, .h))\n', []),                                          # computed
], ids=["D-overrides-ifndef", "if-else", "undef-redefine", "defined-in-a-header", "token-paste"])
def test_include_macro_is_keyed_on_the_header_it_names(tmp_path, prologue, defines):
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 9999999\n")                # the wrong guess
    write(inc / "names.h", '#define HDR "b.h"\n')
    src = prologue + "#include HDR\n" + KERNEL
    edit_and_check(src, inc / "b.h", include_dirs=[str(inc)], defines=defines)


def test_include_macro_is_cached_across_processes(tmp_path):
    inc = tmp_path / "inc"
    write(inc / "b.h", "#define VAL 1111111\n")
    src = '#ifndef HDR\n#define HDR "a.h"\n#endif\n#include HDR\n' + KERNEL
    script = textwrap.dedent(f"""
        import kjit, re
        o = kjit.compile({src!r}, arch="sm_80", target="ptx",
                         options=kjit.CompileOptions(include_dirs=[{str(inc)!r}],
                                                     defines=[("HDR", '"b.h"')]))
        print(o.cache_hit, re.search(rb"mov\\.u32\\s+%r\\d+,\\s*(\\d+);", o.code).group(1).decode())
    """)

    def run():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True)
        assert "CacheWarning" not in out.stderr
        return out.stdout.split()
    assert run() == ["False", "1111111"]
    assert run() == ["True", "1111111"]
    write(inc / "b.h", "#define VAL 2222222\n")
    assert run() == ["False", "2222222"]


# --- 2. directive spellings the preprocessor accepts --------------------------------------------
@pytest.mark.parametrize("directive", [
    '#include \\\n"a.h"\n',
    '#/**/include "a.h"\n',
    '#include /*x*/ "a.h"\n',
    '%:include "a.h"\n',
    '/* a comment */#include "a.h"\n',
    '# /* two\n lines */ include "a.h"\n',
    '??=include "a.h"\n',
], ids=["continued", "comment-after-hash", "comment-before-name", "digraph", "comment-before-hash",
        "multiline-comment", "trigraph"])
def test_every_directive_spelling_is_keyed(tmp_path, directive):
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1\n")
    try:
        ptx(directive + KERNEL, include_dirs=[str(inc)], extra=["--trigraphs"]
            if "??=" in directive else [])
    except kjit.CompileError:
        pytest.skip("NVRTC does not accept this spelling")
    edit_and_check(directive + KERNEL, inc / "a.h", include_dirs=[str(inc)],
                   extra=["--trigraphs"] if "??=" in directive else [])


# --- 3. include directories and pre-includes given as split flags -------------------------------
@pytest.mark.parametrize("flags", [
    lambda d: ["-I", d], lambda d: ["--include-path", d], lambda d: [f"--include-path={d}"],
], ids=["-I-split", "--include-path-split", "--include-path="])
def test_split_include_flags_are_keyed(tmp_path, flags):
    inc = tmp_path / "inc"
    edit_and_check('#include "a.h"\n' + KERNEL, inc / "a.h", extra=flags(str(inc)))


@pytest.mark.parametrize("flags", [
    lambda p: ["--pre-include", p], lambda p: ["-include", p], lambda p: [f"--pre-include={p}"],
], ids=["--pre-include-split", "-include-split", "--pre-include="])
def test_split_pre_include_flags_are_keyed(tmp_path, flags):
    header = tmp_path / "pre.h"
    write(header, "#define VAL 1\n")
    edit_and_check(KERNEL, header, extra=flags(str(header)))


# --- 4. symlinks and .. --------------------------------------------------------------------------
def test_dotdot_after_a_symlinked_directory(tmp_path):
    """"sub/../a.h" with sub a link: the OS resolves .. through the link, not as text."""
    inc, elsewhere = tmp_path / "inc", tmp_path / "elsewhere"
    write(inc / "a.h", "#define VAL 9999999\n")               # what text resolution finds
    (elsewhere / "deep").mkdir(parents=True)
    (inc / "sub").symlink_to(elsewhere / "deep")
    edit_and_check('#include "sub/../a.h"\n' + KERNEL, elsewhere / "a.h", include_dirs=[str(inc)])


def test_source_named_through_a_symlinked_directory(tmp_path, monkeypatch):
    real, link = tmp_path / "real" / "src", tmp_path / "link"
    real.mkdir(parents=True)
    link.symlink_to(real)
    write(tmp_path / "a.h", "#define VAL 9999999\n")          # link/../a.h as text
    monkeypatch.chdir(tmp_path)
    src = '#include "../a.h"\n' + KERNEL
    header = tmp_path / "real" / "a.h"
    write(header, "#define VAL 1111111\n")
    a = kjit.compile(src, arch="sm_80", target="ptx", name="link/k.cu")
    assert val(a) == 1111111
    write(header, "#define VAL 2222222\n")
    assert val(kjit.compile(src, arch="sm_80", target="ptx", name="link/k.cu")) == 2222222


# --- 5. __has_include and headers appearing later -----------------------------------------------
def test_has_include_of_a_macro(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    src = ('#define OPT "opt.h"\n#if __has_include(OPT)\n#define VAL 2222222\n#else\n'
           '#define VAL 1111111\n#endif\n' + KERNEL)
    assert val(ptx(src, include_dirs=[str(inc)])) == 1111111
    assert ptx(src, include_dirs=[str(inc)]).cache_hit is True
    write(inc / "opt.h", "// present\n")
    assert val(ptx(src, include_dirs=[str(inc)])) == 2222222
    (inc / "opt.h").unlink()
    assert val(ptx(src, include_dirs=[str(inc)])) == 1111111


def test_header_appearing_in_an_earlier_directory_shadows(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    write(second / "a.h", "#define VAL 1111111\n")
    src = '#define NAME a\n#define H <NAME.h>\n#include H\n' + KERNEL
    opts = dict(include_dirs=[str(first), str(second)])
    assert val(ptx(src, **opts)) == 1111111
    write(first / "a.h", "#define VAL 2222222\n")
    assert val(ptx(src, **opts)) == 2222222


def test_header_appearing_next_to_the_source_shadows(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1111111\n")
    monkeypatch.chdir(tmp_path)
    src = '#include "a.h"\n' + KERNEL
    assert val(ptx(src, include_dirs=[str(inc)])) == 1111111
    write(tmp_path / "a.h", "#define VAL 2222222\n")          # the source's name is relative
    assert val(ptx(src, include_dirs=[str(inc)])) == 2222222


# --- without the observer: compiles that may read headers are not cached ------------------------
def test_without_the_observer_header_compiles_are_not_cached(tmp_path, monkeypatch):
    import warnings
    monkeypatch.setitem(observe._state, "module", None)
    monkeypatch.setitem(observe._state, "error", "the compile observer is not built: test")
    monkeypatch.setattr(compiled, "_warned", set())
    assert not observe.available() and observe.describe()["mode"] == "scanned"
    inc = tmp_path / "inc"
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    write(inc / "a.h", "#define VAL 1111111\n")
    with pytest.warns(kjit.cache.CacheWarning, match="not built: test.*C extension"):
        first = ptx(src, **opts)
    assert val(first) == 1111111 and first.cache_hit is None
    write(inc / "a.h", "#define VAL 2222222\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # said once, not per compile
        again = ptx(src, **opts)
    assert val(again) == 2222222 and again.cache_hit is None
    plain = KERNEL.replace("VAL", "3333333")                    # no header: still cached
    assert ptx(plain).cache_hit is False and ptx(plain).cache_hit is True
    out = subprocess.run([sys.executable, "-m", "kjit", "info"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), KJIT_OBSERVE="0"))
    assert "header keys     not observed" in out.stdout and "not cached" in out.stdout


def test_when_the_library_cannot_be_hooked_header_compiles_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(observe, "_state", dict(observe._state, installed={}, error=None))
    monkeypatch.setitem(observe.REQUIRED, "cuda", (("libnvrtc-that-is-not-loaded",),))
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    with pytest.warns(kjit.cache.CacheWarning, match="not found to hook"):
        first = ptx(src, **opts)                                # compiled once, not stored
    assert val(first) == 1111111 and first.cache_hit is None
    assert not observe.available() and "not found to hook" in observe.describe()["reason"]
    write(inc / "a.h", "#define VAL 2222222\n")
    assert val(ptx(src, **opts)) == 2222222


def test_info_says_compiles_are_observed():
    out = subprocess.run([sys.executable, "-m", "kjit", "info"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))))
    assert "header keys     observed" in out.stdout


def test_the_recorder_sees_only_the_recording_thread(tmp_path):
    from kjit.compiler.keys import _observe
    import threading
    header = write(tmp_path / "a.h", "#define VAL 1\n")
    ptx('#include "a.h"\n' + KERNEL, include_dirs=[str(tmp_path)])  # hooks installed
    with observe.collecting() as seen:
        other = threading.Thread(target=lambda: ptx('#include "a.h"\n// other\n' + KERNEL,
                                                    include_dirs=[str(tmp_path)], defines=[("X", "1")]))
        other.start()
        other.join()
    assert seen == []                                           # another thread's compile
    with observe.collecting() as seen:
        compiled.compile_uncached(kjit.compiler.cached.make_request(
            '#include "a.h"\n' + KERNEL, arch="sm_80", target="ptx",
            options=kjit.CompileOptions(include_dirs=[str(tmp_path)])))
    assert str(header) in seen[0].read and not _observe.recording()



# --- hiprtc: observed through LLVM's file calls ---------------------------------------------------
def test_hip_compiles_are_observed_and_follow_their_headers(tmp_path):
    from kjit.compiler import hiprtc
    if not hiprtc.available():
        pytest.skip("no hiprtc library here")
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 9999999\n")
    src = ('#ifndef HDR\n#define HDR "a.h"\n#endif\n#include HDR\n'
           'extern "C" __global__ void k(int* p) { *p = VAL; }\n')
    opts = kjit.CompileOptions(include_dirs=[str(inc)], defines=[("HDR", '"b.h"')])

    def hip():
        return kjit.compile(src, arch="gfx90a", backend="hip", options=opts)
    write(inc / "b.h", "#define VAL 1111111\n")
    one = hip()
    assert one.cache_hit is False and hip().cache_hit is True
    assert observe._state["installed"].get("hip") is True
    write(inc / "b.h", "#define VAL 2222222\n")
    two = hip()
    assert two.cache_hit is False and two.code != one.code
    write(inc / "b.h", "#define VAL 1111111\n")
    again = hip()
    assert again.cache_hit is True and again.code == one.code


def test_a_second_hook_install_still_sees_the_library_hooked(tmp_path):
    """Two threads' first compiles may both install the hooks: the second finds the slots
    already pointing at kjit's wrappers, and must count the library as hooked, not turn
    observation off for the rest of the process."""
    mod = observe._module()
    if mod is None or not observe.available("cuda"):
        pytest.skip("the compile observer (kjit/compiler/keys/_observe.c) is not built here")
    kjit.compile('extern "C" __global__ void k() {}', arch="sm_90", cache=False)   # NVRTC loaded
    libs = list(observe.LIBRARIES["cuda"])
    first = {os.path.basename(p): n for p, n in mod.install(libs)}
    again = {os.path.basename(p): n for p, n in mod.install(libs)}
    nvrtc = [name for name in first if name.startswith("libnvrtc.so")]
    assert nvrtc and first[nvrtc[0]] > 0 and again == first
