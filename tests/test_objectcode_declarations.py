"""Kernel declarations go wherever the code goes, and ObjectCode and LinkResult pickle.

The parameter types kjit reads from the source (ObjectCode.declarations) are what lets a
launch take a Python int for an `int` parameter. They must survive a link (LTO-IR and
relocatable PTX, nvJitLink), a link cache hit, save/from_file, fatbins and `kjit build`, the
compile cache, and pickle (multiprocessing, Ray and Dask move compiled code that way).
Cases from issue 34's conformance run: two LTO-IR programs linked as cuda.core's linker tests
link them (NVIDIA/cuda-python, cuda_core/tests/test_linker.py), code saved and read back.
"""
from __future__ import annotations

import copy
import json
import pickle

import pytest

import kjit
from kjit.build import run_build
from kjit.build.pack import make_fatbin
from kjit.errors import KjitError
from kjit.linker import LinkResult, link
from kjit.objectcode import SIDECAR_SUFFIX, ObjectCode, merge_declarations
from kjit.runtime.signature import resolve_slots

ARCH = "sm_90"
RDC = kjit.CompileOptions(relocatable=True)

# A device library and a kernel that calls it, extern "C" as cuda.core's tests write them.
# (How declarations are read from source, line splices included, is
# tests/test_declarations*'s business: these tests carry what was read.)
LIB = r'''
extern "C" __device__ int scale(int x, int by) { return x * by; }
'''
MAIN = r'''
extern "C" __device__ int scale(int x, int by);
extern "C" __global__ void scaled(int* out, int factor) {
    out[threadIdx.x] = scale(threadIdx.x, factor);
}
'''
# a second kernel in another program: the link result knows both kernels' parameters
OTHER = r'''
struct Pair { int a; float b; };
extern "C" __global__ void take_pair(Pair p, float* out) { out[0] = p.a + p.b; }
'''
TEMPLATE = r'''
template <typename T> __global__ void fill(T* out, T value, unsigned n) {
    if (threadIdx.x < n) out[threadIdx.x] = value;
}
'''


def param_types(obj: ObjectCode, kernel: str) -> list[str]:
    """The C types kjit gives a kernel's parameters when it loads `obj` (what a launch checks
    and converts Python values with); KjitError when it cannot tell them."""
    slots = resolve_slots(obj, kernel, obj.lowered_name(kernel), None)
    return [s.ctype.name for s in slots]


def lto(src: str, name: str) -> ObjectCode:
    return kjit.compile(src, arch=ARCH, target="ltoir", options=RDC, name=name)


def test_code_without_declarations_cannot_type_its_parameters():
    """What the tests below guard against: the bytes alone do not say that `factor` is int."""
    res = link([lto(LIB, "lib.cu"), lto(MAIN, "main.cu")], arch=ARCH)
    bare = ObjectCode(res.code)
    assert bare.declarations == ""
    with pytest.raises(KjitError, match="cannot tell the parameter types"):
        param_types(bare, "scaled")


# --- link ------------------------------------------------------------------------------

def test_linking_two_lto_ir_programs_keeps_the_kernels_parameter_types():
    res = link([lto(LIB, "lib.cu"), lto(MAIN, "main.cu"), lto(OTHER, "other.cu")], arch=ARCH)
    assert param_types(res, "scaled") == ["int*", "int"]
    assert param_types(res, "take_pair")[1] == "float*"
    assert "struct Pair" in res.declarations or "Pair" in res.declarations
    assert set(res.entry_points) == {"scaled", "take_pair"}


def test_linking_relocatable_ptx_keeps_them_too():
    def ptx(src: str, name: str) -> ObjectCode:
        return kjit.compile(src, arch=ARCH, target="ptx", options=RDC, name=name)
    res = link([ptx(LIB, "lib.cu"), ptx(MAIN, "main.cu")], arch=ARCH, backend="nvjitlink")
    assert param_types(res, "scaled") == ["int*", "int"]


def test_a_link_cache_hit_keeps_them():
    inputs = [lto(LIB, "lib.cu"), lto(MAIN, "main.cu")]
    first = link(inputs, arch=ARCH)
    again = link(inputs, arch=ARCH)
    assert again.cache_hit and not first.cache_hit
    assert again.declarations == first.declarations != ""
    assert param_types(again, "scaled") == ["int*", "int"]


def test_a_cache_hit_takes_them_from_this_links_inputs():
    """The link key is the inputs' bytes: the same PTX read from a file without declarations
    and fresh from kjit.compile are one input. A hit made by the bare one still types the
    parameters when the inputs carry declarations, and adds none when they carry none."""
    def ptx(src: str) -> ObjectCode:
        return kjit.compile(src, arch=ARCH, target="ptx", options=RDC)
    with_decls = [ptx(LIB), ptx(MAIN)]
    bare = [ObjectCode(o.code) for o in with_decls]
    first = link(bare, arch=ARCH, backend="nvjitlink")
    assert first.declarations == ""
    hit = link(with_decls, arch=ARCH, backend="nvjitlink")
    assert hit.cache_hit and param_types(hit, "scaled") == ["int*", "int"]
    assert link(bare, arch=ARCH, backend="nvjitlink").declarations == ""


def test_declarations_of_one_source_linked_twice_appear_once():
    a = lto(MAIN, "main.cu")
    assert merge_declarations([a.declarations, a.declarations, ""]) == a.declarations
    assert merge_declarations([]) == ""


# --- save / from_file, fatbins, kjit build ------------------------------------------------

def test_save_and_from_file_keep_them(tmp_path):
    obj = kjit.compile(MAIN.replace("extern \"C\" __device__ int scale(int x, int by);",
                                    "__device__ int scale(int x, int by) { return x * by; }"),
                       arch=ARCH)
    path = obj.save(tmp_path / "k.cubin")
    side = json.loads((tmp_path / ("k.cubin" + SIDECAR_SUFFIX)).read_text())
    assert side["declarations"] == obj.declarations
    back = ObjectCode.from_file(path)
    assert back.declarations == obj.declarations
    assert param_types(back, "scaled") == ["int*", "int"]


def test_a_linked_result_saved_and_read_back_keeps_them(tmp_path):
    res = link([lto(LIB, "lib.cu"), lto(MAIN, "main.cu")], arch=ARCH)
    back = ObjectCode.from_file(res.save(tmp_path / "linked.cubin"))
    assert param_types(back, "scaled") == ["int*", "int"]


def test_a_sidecar_whose_declarations_are_not_text_is_ignored(tmp_path):
    obj = kjit.compile(MAIN.replace("extern \"C\" __device__ int scale(int x, int by);",
                                    "__device__ int scale(int x, int by) { return x; }"), arch=ARCH)
    path = obj.save(tmp_path / "k.cubin")
    side = tmp_path / ("k.cubin" + SIDECAR_SUFFIX)
    record = json.loads(side.read_text())
    record["declarations"] = ["not", "text"]
    side.write_text(json.dumps(record))
    back = ObjectCode.from_file(path)
    assert back.declarations == "" and back.code == obj.code


def test_a_fatbin_holds_the_declarations_of_its_entries():
    cubin = kjit.compile(OTHER, arch=ARCH)
    ptx = kjit.compile(TEMPLATE, arch="compute_80", target="ptx", name_expressions=["fill<int>"])
    fat = make_fatbin([cubin, ptx])
    assert cubin.declarations in fat.declarations and ptx.declarations in fat.declarations
    assert param_types(fat, "take_pair")[1] == "float*"
    assert param_types(fat, "fill<int>") == ["int*", "int", "unsigned int"]


def test_kjit_build_output_read_back_keeps_them(tmp_path):
    src = tmp_path / "kernels.cu"
    src.write_text(OTHER + MAIN.replace('extern "C" __device__ int scale(int x, int by);',
                                        "__device__ int scale(int x, int by) { return x + by; }"))
    res = run_build([src], output=tmp_path / "k.fatbin", archs=["sm_80,sm_90"], jobs=1)
    back = ObjectCode.from_file(res.output)
    assert back.kind == "fatbin" and back.declarations == res.object.declarations != ""
    assert param_types(back, "scaled") == ["int*", "int"]


def test_a_linked_kjit_build_keeps_them(tmp_path):
    lib, main = tmp_path / "lib.cu", tmp_path / "main.cu"
    lib.write_text(LIB)
    main.write_text(MAIN)
    res = run_build([lib, main], output=tmp_path / "linked.fatbin", archs=["sm_90"], jobs=1)
    back = ObjectCode.from_file(res.output)
    assert param_types(back, "scaled") == ["int*", "int"]


# --- the compile cache ------------------------------------------------------------------

def test_a_compile_cache_hit_keeps_them():
    first = kjit.compile(OTHER, arch=ARCH)
    hit = kjit.compile(OTHER, arch=ARCH)
    assert hit.cache_hit and not first.cache_hit
    assert hit.declarations == first.declarations != ""
    assert param_types(hit, "take_pair")[1] == "float*"


# --- pickle -----------------------------------------------------------------------------

def _fields(obj: ObjectCode) -> tuple:
    return (obj.code, obj.kind, obj.arch, obj.log, dict(obj.symbols), obj.name,
            dict(obj.metadata), obj.cache_hit, obj.declarations)


@pytest.mark.parametrize("target", ["cubin", "ptx", "ltoir"])
def test_an_object_code_pickles_and_round_trips(target):
    obj = kjit.compile(TEMPLATE, arch=ARCH, target=target, name_expressions=["fill<float>"],
                       options=RDC if target == "ltoir" else None)
    obj.entry_points   # cached on the instance: not part of what is pickled
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(obj, protocol=protocol))
        assert type(back) is ObjectCode and back == obj
        assert _fields(back) == _fields(obj)
        assert back.lowered_name("fill<float>") == obj.lowered_name("fill<float>")
    with pytest.raises(AttributeError, match="immutable"):
        back.kind = "ptx"


def test_copies_are_equal_values():
    obj = kjit.compile(OTHER, arch=ARCH)
    assert _fields(copy.deepcopy(obj)) == _fields(obj) == _fields(copy.copy(obj))


def test_a_link_result_pickles_and_round_trips():
    res = link([lto(LIB, "lib.cu"), lto(MAIN, "main.cu")], arch=ARCH,
               options=kjit.LinkOptions(verbose=True))
    back = pickle.loads(pickle.dumps(res))
    assert type(back) is LinkResult and back == res and _fields(back) == _fields(res)
    assert (back.backend, back.reason, back.info_log, back.error_log, back.wall_time_ms) == (
        res.backend, res.reason, res.info_log, res.error_log, res.wall_time_ms)
    assert "scaled" in back.info_log   # nvJitLink's verbose log came along
    assert param_types(back, "scaled") == ["int*", "int"]


def test_a_link_result_is_an_object_code():
    res = link([lto(LIB, "lib.cu"), lto(MAIN, "main.cu")], arch=ARCH)
    assert isinstance(res, ObjectCode) and res.kind == "cubin" and res.arch == ARCH
    assert res.object is res and res.entry_points == ("scaled",)
    assert res.code.startswith(b"\x7fELF") and res.log == res.info_log
    changed = res.with_(name="renamed.cubin")
    assert isinstance(changed, LinkResult) and changed.backend == res.backend
    assert "LinkResult(kind='cubin'" in repr(res)
