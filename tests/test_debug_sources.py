"""Kernels compiled with line or debug information name, in their line tables, a real file
that holds their source (kept in the cache's sources/), in the compiling process and in
later ones that hit the cache (docs/debugging.md). No GPU needed: the PTX `.file`
directives and the cubin's DWARF line table are read here."""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kjit
from kjit.cache import sources
from kjit.compiler.cached import compile_key
from kjit.cache.disk import CacheWarning
from kjit.formats.elf import ElfFile

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"
SRC = ('extern "C" __global__ void oob(int* p, int n) {\n'
       '    int i = blockIdx.x * blockDim.x + threadIdx.x;\n'
       '    p[i] = i * 3;   // the line a debugger should show\n'
       '}\n')
LINE = kjit.CompileOptions(line_info=True)


def ptx_files(obj: kjit.ObjectCode) -> list[str]:
    return re.findall(r'\.file\s+\d+\s+"([^"]+)"', obj.code.decode())


def _uleb(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        x = b[i]
        i += 1
        out |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return out, i


def cubin_files(code: bytes) -> list[str]:
    """The file names of a cubin's DWARF .debug_line (versions 2-4, as NVRTC writes them)."""
    elf = ElfFile(code)
    sec = elf.section(".debug_line")
    assert sec is not None, "the cubin has no line table"
    b, off, out = elf.section_bytes(sec), 0, []
    while off < len(b):
        length, version = struct.unpack_from("<IH", b, off)
        assert 2 <= version <= 4, f"DWARF line table version {version}"
        # minimum_instruction_length, [maximum_operations_per_instruction,] default_is_stmt,
        # line_base, line_range, then opcode_base and the standard opcodes' lengths
        i = off + 10 + 1 + (1 if version >= 4 else 0) + 3
        i += 1 + b[i] - 1
        dirs = [""]
        while b[i]:
            j = b.index(0, i)
            dirs.append(b[i:j].decode())
            i = j + 1
        i += 1
        while b[i]:
            j = b.index(0, i)
            name = b[i:j].decode()
            d, i = _uleb(b, j + 1)
            _, i = _uleb(b, i)
            _, i = _uleb(b, i)
            out.append(os.path.join(dirs[d], name))
        off += 4 + length
    return out


def cache_root() -> Path:
    return Path(os.path.abspath(os.environ["KJIT_CACHE_DIR"]))


def only_source_file(obj: kjit.ObjectCode) -> str:
    files = ptx_files(obj) if obj.kind == "ptx" else cubin_files(obj.code)
    mine = [f for f in files if not f.endswith("__kjit_prelude.h")]
    assert len(mine) == 1, files
    return mine[0]


# --- the compiling process --------------------------------------------------------------------
def test_without_name_ptx_names_a_kept_file_holding_the_source():
    obj = kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE)
    path = only_source_file(obj)
    assert path.startswith(str(cache_root() / "sources") + os.sep)
    assert path.endswith(os.sep + "kernel.cu")
    assert Path(path).read_text() == SRC
    assert not os.access(path, os.W_OK) or os.geteuid() == 0   # read-only (root ignores it)
    assert Path(path).stat().st_mode & 0o222 == 0


def test_with_name_the_kept_file_keeps_the_name_and_every_ptx_file_exists():
    obj = kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE, name="user_kernel.cu")
    assert obj.name == "user_kernel.cu"
    path = only_source_file(obj)
    assert path.endswith(os.sep + "user_kernel.cu") and Path(path).read_text() == SRC
    assert all(os.path.isfile(f) for f in ptx_files(obj))


def test_cubin_line_table_names_the_kept_files_with_debug_and_in_memory_headers():
    header = "__device__ int triple(int x) {\n    return 3 * x;\n}\n"
    src = '#include "helpers/triple.h"\n' + SRC.replace("i * 3", "triple(i)")
    opts = kjit.CompileOptions(debug=True, headers={"helpers/triple.h": header})
    obj = kjit.compile(src, arch=ARCH, options=opts, name="dbg.cu")
    files = cubin_files(obj.code)
    by_name = {os.path.basename(f): f for f in files}
    assert Path(by_name["dbg.cu"]).read_text() == src
    assert Path(by_name["triple.h"]).read_text() == header
    assert by_name["triple.h"].endswith(os.sep + os.path.join("helpers", "triple.h"))
    assert all(f.startswith(str(cache_root() / "sources")) and os.path.isfile(f) for f in files)


def test_two_sources_with_one_name_get_two_files():
    other = SRC.replace("i * 3", "i * 5")
    a = only_source_file(kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE, name="k.cu"))
    b = only_source_file(kjit.compile(other, arch=ARCH, target="ptx", options=LINE, name="k.cu"))
    assert a != b
    assert Path(a).read_text() == SRC and Path(b).read_text() == other


def test_nothing_kept_without_line_info():
    obj = kjit.compile(SRC, arch=ARCH, target="ptx", name="plain.cu")
    assert ptx_files(obj) == []
    assert not (cache_root() / "sources").exists()


def test_switched_off_the_line_table_names_the_name_as_given(monkeypatch, tmp_path):
    monkeypatch.setenv("KJIT_DEBUG_SOURCES", "0")
    monkeypatch.chdir(tmp_path)
    obj = kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE, name="mine.cu")
    assert ptx_files(obj) == [str(tmp_path / "mine.cu")]
    assert not (cache_root() / "sources").exists()


def test_quoted_includes_and_messages_are_as_without_kept_sources(monkeypatch, tmp_path):
    """The #line that names the kept file changes neither where "quoted" includes are found
    (next to the name) nor the names compiler messages use."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "val.h").write_text("#define VAL 41\n")
    monkeypatch.chdir(tmp_path)
    src = '#include "val.h"\n' + SRC.replace("i * 3", "VAL")
    obj = kjit.compile(src, arch=ARCH, target="ptx", options=LINE, name="src/k.cu")
    assert "41" in obj.code.decode()
    bad = 'extern "C" __global__ void k(int* p) {\n    p[0] = nope;\n}\n'
    with pytest.raises(kjit.CompileError) as info:
        kjit.compile(bad, arch=ARCH, options=LINE, name="bad.cu")
    assert "bad.cu(2): error" in info.value.log
    assert "sources" not in info.value.log
    assert "bad.cu, line 2:" in str(info.value)


def test_an_unwritable_location_warns_and_the_compile_goes_on(monkeypatch):
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "sources").write_text("a file where the directory should be\n")
    with pytest.warns(CacheWarning, match="cannot keep its source"):
        obj = kjit.compile(SRC, arch=ARCH, options=LINE, name="nowhere.cu")
    assert obj.cache_hit is False
    assert obj.kind == "cubin" and "oob" in obj.entry_points
    assert sources.counts["failed"] >= 1
    again = kjit.compile(SRC, arch=ARCH, options=LINE, name="nowhere.cu")   # still cached
    assert again.cache_hit is True


def test_a_write_refused_by_the_system_does_not_fail_the_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(sources, "_write", refuse)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        obj = kjit.compile(SRC.replace("3", "4"), arch=ARCH, target="ptx", options=LINE)
    assert ".entry oob" in obj.code.decode()
    assert any("Permission denied" in str(w.message) for w in seen)


# --- keys: a binary naming a path is found only where a compile would name that path -----------
def test_the_key_follows_the_cache_directory_only_for_debuggable_compiles(monkeypatch, tmp_path):
    keys = {}
    for d in ("a", "b"):
        monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / d))
        keys[d] = (compile_key(SRC, arch=ARCH, options=LINE),
                   compile_key(SRC, arch=ARCH))
    assert keys["a"][0] != keys["b"][0]
    assert keys["a"][1] == keys["b"][1]


def test_changing_the_cache_directory_in_process_names_the_new_one(monkeypatch, tmp_path):
    for d in ("a", "b", "a"):
        monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / d))
        path = only_source_file(kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE))
        assert path.startswith(str(tmp_path / d / "sources")) and os.path.isfile(path)


def test_a_repeat_in_process_writes_a_removed_file_again():
    path = only_source_file(kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE))
    os.chmod(path, 0o644)
    os.unlink(path)
    again = kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE)
    assert again.cache_hit is True and Path(path).read_text() == SRC


# --- later processes ---------------------------------------------------------------------------
_CHILD = r'''
import json, sys, kjit
sys.path.insert(0, sys.argv[1])
from test_debug_sources import SRC, LINE, ARCH, cubin_files
obj = kjit.compile(SRC, arch=ARCH, options=LINE, name="user_kernel.cu")
print(json.dumps({"hit": obj.cache_hit, "files": cubin_files(obj.code)}))
'''


def _child() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "tests")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_later_process_hitting_the_cache_gets_a_binary_whose_file_exists():
    first = _child()
    assert first["hit"] is False
    (path,) = [f for f in first["files"] if f.endswith("user_kernel.cu")]
    assert Path(path).read_text() == SRC
    kjit.cache.clear()   # the entries go, and with them every kept source
    assert not os.path.exists(path)
    _child()
    # removed between processes: the next one, a hit, writes it again
    os.chmod(path, 0o644)
    os.unlink(path)
    second = _child()
    assert second["hit"] is True and second["files"] == first["files"]
    assert Path(path).read_text() == SRC


# --- pruning ------------------------------------------------------------------------------------
def test_prune_removes_the_sources_no_entry_names_and_keeps_the_others(monkeypatch):
    named = only_source_file(kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE))
    orphan = sources.file_in(str(cache_root() / "sources"), "// no entry\n", "orphan.cu")
    assert sources.ensure(str(cache_root() / "sources"), "// no entry\n", "orphan.cu") is None
    monkeypatch.setattr(sources, "MIN_AGE_S", 0.0)
    report = kjit.cache.prune(older_than="365d")
    assert report["sources_removed"] == 1
    assert os.path.isfile(named) and not os.path.exists(orphan)
    assert not os.path.exists(os.path.dirname(orphan))


def test_prune_leaves_young_sources_a_compile_may_still_store_an_entry_for():
    young = sources.file_in(str(cache_root() / "sources"), "// compiling\n", "young.cu")
    assert sources.ensure(str(cache_root() / "sources"), "// compiling\n", "young.cu") is None
    kjit.compile(SRC, arch=ARCH, target="ptx")   # opens the cache
    assert kjit.cache.prune(older_than="365d")["sources_removed"] == 0
    assert os.path.isfile(young)


def test_stats_counts_the_kept_sources():
    kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE)
    s = kjit.cache.stats()["sources"]
    assert s["files"] == 2 and s["bytes"] > len(SRC)   # the source and kjit's nvcc prelude


def test_a_baked_read_only_cache_serves_its_binary_naming_its_own_kept_file(monkeypatch, tmp_path):
    baked, mine = tmp_path / "baked", tmp_path / "mine"
    monkeypatch.setenv("KJIT_CACHE_DIR", str(baked))
    built = only_source_file(kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE))
    assert built.startswith(str(baked / "sources"))
    from kjit.cache import readonly
    real = readonly.writable
    monkeypatch.setattr(readonly, "writable", lambda p: p != baked and real(p))
    monkeypatch.setenv("KJIT_CACHE_DIR", os.pathsep.join([str(baked), str(mine)]))
    hit = kjit.compile(SRC, arch=ARCH, target="ptx", options=LINE)
    assert hit.cache_hit is True and only_source_file(hit) == built
    other = SRC.replace("i * 3", "i * 9")
    new = only_source_file(kjit.compile(other, arch=ARCH, target="ptx", options=LINE))
    assert new.startswith(str(mine / "sources")) and Path(new).read_text() == other


def test_compile_many_keeps_the_sources_its_workers_compile():
    items = [{"source": SRC.replace("i * 3", f"i * {n}"), "name": f"k{n}.cu"} for n in (3, 4)]
    objs = kjit.compile_many(items, arch=ARCH, target="ptx", options=LINE, jobs=2)
    for item, obj in zip(items, objs):
        path = only_source_file(obj)
        assert path.endswith(item["name"]) and Path(path).read_text() == item["source"]


def test_a_baked_cache_holding_the_source_but_not_its_headers_is_not_named(monkeypatch, tmp_path):
    # a read-only cache listed with a writable one, baked by an install whose in-memory headers
    # (kjit's prelude among them) differ: the binary must name a directory that holds them all
    src = 'extern "C" __global__ void f(float* p) { p[0] = 1; }\n'
    baked, mine = tmp_path / "baked", tmp_path / "mine"
    (baked / "sources").mkdir(parents=True, mode=0o700)
    only_src = Path(sources.file_in(str(baked / "sources"), src, "k.cu"))
    only_src.parent.mkdir(parents=True, mode=0o700)
    only_src.write_text(src)
    monkeypatch.setenv("KJIT_CACHE_DIR", os.pathsep.join([str(mine), str(baked)]))
    opts = kjit.CompileOptions(line_info=True, headers={"h.h": "#define H 1\n"})
    obj = kjit.compile(src + '#include "h.h"\n', name="k.cu", arch="sm_90", target="ptx",
                       options=opts)
    for f in ptx_files(obj):
        assert Path(f).is_file(), f
    from kjit.compiler import kept
    assert kept.sources_dir(src, "k.cu", "cuda", opts) == str(mine / "sources")
