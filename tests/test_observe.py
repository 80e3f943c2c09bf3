"""Exact by observation: the cache key covers exactly what NVRTC read, so no way of naming,
finding or changing a header returns a binary built from other contents. Each test edits a
header the kernel's constant comes from and checks the PTX holds the new constant, in this
process and (where it matters) in fresh processes. (CPU: NVRTC needs no GPU.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kjit
from kjit.compiler import api as compiled
from kjit.compiler import observe, snapshot

pytestmark = pytest.mark.skipif(not observe.available(), reason="the compile observer is not built")

REPO = Path(__file__).resolve().parents[1]
KERNEL = 'extern "C" __global__ void k(int* p) { *p = VAL; }\n'


def settle() -> None:
    """As between an edit and a compile: past the file system's timestamp tick."""
    time.sleep(snapshot.timestamp_granularity())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    settle()
    return path


def val(obj) -> int:
    """The constant the kernel stores, read from its PTX."""
    m = re.search(rb"mov\.u32\s+%r\d+,\s*(\d+);", obj.code)
    assert m, obj.code.decode()
    return int(m.group(1))


def ptx(src: str, **opts):
    return kjit.compile(src, arch="sm_80", target="ptx", options=kjit.CompileOptions(**opts))


def edit_and_check(src: str, header: Path, **opts) -> None:
    """The constant follows the header through edits, and an unchanged header is a hit."""
    write(header, "#define VAL 1111111\n")
    a = ptx(src, **opts)
    assert val(a) == 1111111
    assert ptx(src, **opts).cache_hit is True
    write(header, "#define VAL 2222222\n")
    b = ptx(src, **opts)
    assert val(b) == 2222222 and b.cache_hit is False
    assert ptx(src, **opts).cache_hit is True
    write(header, "#define VAL 1111111\n")
    assert val(ptx(src, **opts)) == 1111111


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
        env = dict(os.environ, PYTHONPATH=str(REPO))
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


# --- 6. one long-lived process: change notification follows what the path names now ------------
@pytest.fixture
def notified(monkeypatch):
    """Repeats trust inotify from the first one (no stat check in between)."""
    from kjit.compiler import watch
    if not sys.platform.startswith("linux"):
        pytest.skip("change notification is Linux-only")
    monkeypatch.setattr(compiled, "STAT_CHECKS_BEFORE_WATCHING", 0)
    assert watch._inotify() is not None


def edit_in_place(path: Path, text: str) -> None:
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()
    settle()


def repeat(src: str, opts: dict, times: int = 2) -> list[int]:
    return [val(ptx(src, **opts)) for _ in range(times)]


def test_rename_save_with_a_backup_then_in_place_edits(tmp_path, notified):
    """Editors save by writing a new file and renaming it over the old, keeping the old inode
    as a backup: the watch must move to the new inode."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert repeat(src, opts) == [1111111, 1111111]
    os.link(header, inc / "a.h~")                               # the backup keeps the old inode
    write(inc / "a.h.tmp", "#define VAL 2222222\n")
    os.replace(inc / "a.h.tmp", header)
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(header, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(header, "#define VAL 4444444\n")
    assert repeat(src, opts) == [4444444, 4444444]


def test_retargeted_header_symlink_then_in_place_edits(tmp_path, notified):
    inc = tmp_path / "inc"
    one = write(inc / "v1.h", "#define VAL 1111111\n")
    two = write(inc / "v2.h", "#define VAL 2222222\n")
    (inc / "a.h").symlink_to("v1.h")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert repeat(src, opts) == [1111111, 1111111]
    (inc / "tmp").symlink_to("v2.h")
    os.replace(inc / "tmp", inc / "a.h")
    settle()
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(two, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(one, "#define VAL 5555555\n")                 # no longer read: still a hit
    assert ptx(src, **opts).cache_hit is True


def test_swapped_symlinked_include_directory_then_in_place_edits(tmp_path, notified):
    one = write(tmp_path / "one" / "a.h", "#define VAL 1111111\n")
    two = write(tmp_path / "two" / "a.h", "#define VAL 2222222\n")
    link = tmp_path / "inc"
    link.symlink_to(tmp_path / "one")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(link)])
    assert repeat(src, opts) == [1111111, 1111111]
    (tmp_path / "tmp").symlink_to(tmp_path / "two")
    os.replace(tmp_path / "tmp", link)
    settle()
    assert repeat(src, opts) == [2222222, 2222222]
    edit_in_place(two, "#define VAL 3333333\n")
    assert repeat(src, opts) == [3333333, 3333333]
    edit_in_place(one, "#define VAL 4444444\n")
    assert repeat(src, opts) == [3333333, 3333333]


# --- 7. a header edited while the compiler runs ------------------------------------------------
def test_edit_and_revert_during_the_compile_is_returned_not_stored(tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    real = compiled.compile_uncached

    def compile_while_someone_edits(req):
        obj = real(req)                                        # NVRTC read 1111111
        header.write_text("#define VAL 2222222\n")             # edited after it read ...
        header.write_text("#define VAL 1111111\n")             # ... and put back
        return obj
    monkeypatch.setattr(compiled, "compile_uncached", compile_while_someone_edits)
    before = kjit.cache.stats()["unstorable"]
    first = ptx(src, **opts)
    assert val(first) == 1111111 and first.cache_hit is None   # returned, not stored
    assert kjit.cache.stats()["unstorable"] == before + 1
    monkeypatch.setattr(compiled, "compile_uncached", real)
    settle()
    assert ptx(src, **opts).cache_hit is False                 # compiled again, stored now
    assert ptx(src, **opts).cache_hit is True


def test_header_changed_between_the_read_and_the_key_is_not_stored(tmp_path, monkeypatch):
    """The compiler read one content; when kjit hashes the header it holds another: the
    result must not be filed under the other content's key."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    real = compiled.compile_uncached

    def compile_then_edit(req):
        obj = real(req)
        time.sleep(snapshot.timestamp_granularity())
        header.write_text("#define VAL 2222222\n")
        return obj
    monkeypatch.setattr(compiled, "compile_uncached", compile_then_edit)
    assert val(ptx(src, **opts)) == 1111111
    monkeypatch.setattr(compiled, "compile_uncached", real)
    settle()
    got = ptx(src, **opts)
    assert val(got) == 2222222


def test_a_header_dated_in_the_future_is_still_cached(tmp_path):
    """Archives and skewed clocks leave future mtimes: only ctime tells a recent write."""
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    future = time.time() + 10 * 365 * 86400
    os.utime(header, (future, future))
    settle()
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    assert ptx(src, **opts).cache_hit is False
    assert ptx(src, **opts).cache_hit is True


def test_a_thread_swapping_a_header_during_compiles_never_leaves_a_wrong_entry(tmp_path):
    import threading
    inc = tmp_path / "inc"
    header = write(inc / "a.h", "#define VAL 1111111\n")
    texts = ["#define VAL 1111111\n", "#define VAL 2222222\n"]
    stop = threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            tmp = inc / "a.h.tmp"
            tmp.write_text(texts[i % 2])
            os.replace(tmp, header)
            i += 1
            time.sleep(0.001)
    t = threading.Thread(target=swap)
    t.start()
    try:
        for i in range(12):
            src = f'#include "a.h"\n// variant {i % 3}\n' + KERNEL
            ptx(src, include_dirs=[str(inc)])
    finally:
        stop.set()
        t.join()
    compiled._memo.clear()
    for text in texts + texts[::-1]:
        write(header, text)
        want = int(text.split()[2])
        for i in range(3):
            src = f'#include "a.h"\n// variant {i}\n' + KERNEL
            assert val(ptx(src, include_dirs=[str(inc)])) == want


# --- 8. nothing is read from a cache directory that fails the trust checks ---------------------
def test_planted_manifest_in_a_world_writable_headers_dir_is_not_read(tmp_path, monkeypatch):
    import json
    import warnings
    from kjit.cache import core
    from kjit.compiler import manifest, search
    from kjit.compiler.request import make_request
    cache = tmp_path / "cache"
    monkeypatch.setenv("KJIT_CACHE_DIR", str(cache))
    b = kjit.compile(KERNEL.replace("VAL", "2222222"), arch="sm_80", target="ptx")
    b_key = next(iter(manifest_keys(cache)))                  # B's entry and manifest on disk
    a_src = KERNEL.replace("VAL", "1111111")
    req = make_request(a_src, arch="sm_80", target="ptx")
    prekey = compiled.manifest_key(req, search.for_options(req.options, "cuda"), observed=True)
    payload = json.dumps({"records": [{"key": b_key, "snapshot": snapshot.Snapshot().to_json()}]},
                         separators=(",", ":")).encode()
    planted = cache / "headers" / prekey[:2] / f"{prekey}.json"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(manifest._check_line(payload) + b"\n" + payload)
    os.chmod(cache / "headers", 0o777)                          # anyone could have planted it
    compiled._memo.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = kjit.compile(a_src, arch="sm_80", target="ptx")
    assert val(a) == 1111111 and val(b) == 2222222


def manifest_keys(cache: Path) -> list[str]:
    import json
    out = []
    for f in (cache / "headers").rglob("*.json"):
        out += [r["key"] for r in json.loads(f.read_bytes().split(b"\n", 1)[1])["records"]]
    return out


def test_toolkit_record_and_facts_are_not_read_from_an_untrusted_cache_dir(tmp_path, monkeypatch):
    from kjit.compiler import facts, toolkit_headers
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("KJIT_CACHE_DIR", str(cache))
    assert toolkit_headers._record_path() is not None and facts._path() is not None
    os.chmod(cache, 0o777)
    assert toolkit_headers._record_path() is None and facts._path() is None


# --- without the observer: the scanner keys compiles, as before ----------------------------------
def test_without_the_observer_compiles_are_keyed_by_scanning(tmp_path, monkeypatch):
    monkeypatch.setitem(observe._state, "module", None)
    monkeypatch.setitem(observe._state, "error", "the compile observer is not built: test")
    assert not observe.available() and observe.describe()["mode"] == "scanned"
    inc = tmp_path / "inc"
    edit_and_check('#include "a.h"\n' + KERNEL, inc / "a.h", include_dirs=[str(inc)])
    out = subprocess.run([sys.executable, "-m", "kjit", "info"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO), KJIT_OBSERVE="0"))
    assert "header keys     scanned" in out.stdout


def test_when_the_library_cannot_be_hooked_the_scanner_keys_it(tmp_path, monkeypatch):
    monkeypatch.setattr(observe, "_state", dict(observe._state, installed={}, error=None))
    monkeypatch.setitem(observe.REQUIRED, "cuda", (("libnvrtc-that-is-not-loaded",),))
    inc = tmp_path / "inc"
    write(inc / "a.h", "#define VAL 1111111\n")
    src, opts = '#include "a.h"\n' + KERNEL, dict(include_dirs=[str(inc)])
    first = ptx(src, **opts)                                    # compiled once, keyed by the scan
    assert val(first) == 1111111 and first.cache_hit is False
    assert not observe.available() and "not found to hook" in observe.describe()["reason"]
    assert ptx(src, **opts).cache_hit is True
    write(inc / "a.h", "#define VAL 2222222\n")
    assert val(ptx(src, **opts)) == 2222222


def test_info_says_compiles_are_observed():
    out = subprocess.run([sys.executable, "-m", "kjit", "info"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert "header keys     observed" in out.stdout


def test_the_recorder_sees_only_the_recording_thread(tmp_path):
    from kjit.compiler import _observe
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
        compiled.compile_uncached(kjit.compiler.api.make_request(
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
