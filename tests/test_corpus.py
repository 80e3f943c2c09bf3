"""The corpus (tests/corpus): every kernel compiles with no -I, through the toolkit and CCCL
headers from the wheels, for sm_80 and sm_90 (and sm_100 and PTX unless its index entry
lists fewer targets), and provides the kernels its index entry names. (CPU;
tests/test_corpus_gpu.py runs them.)

Kernels written for nvcc that take INFINITY, FLT_MAX, M_PI or `uint` from nvcc's implicit
includes list those names under "nvcc_prelude" in the index: they compile as they are only
where kjit gives device code that prelude."""
from __future__ import annotations

import pytest

import kjit
from kjit.compiler.keys import observe
from corpus import entries, source

TARGETS = [("sm_80", "cubin"), ("sm_90", "cubin"), ("sm_100", "cubin"), ("compute_80", "ptx")]

# What a user would add by hand where the prelude is missing: the standard headers that
# declare those names.
EXPLICIT_INCLUDES = "#include <cmath>\n#include <cfloat>\n#include <cstdint>\n"


# Kernels kjit compiles but does not cache, and why (each is compiled afresh on every call).
_THRUST_MACRO_INCLUDE = ("reaches thrust headers whose #include names a macro "
                         "(__THRUST_DEVICE_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE), which kjit "
                         "cannot key the cache on")
# Only where the compiler cannot be observed (no C extension) does the include scan key a
# compile, and it cannot follow these.
UNCACHED = {} if observe.available("cuda") else {
    "cub_block_radix_sort.cu": "cub/block/block_load.cuh " + _THRUST_MACRO_INCLUDE,
    "cub_block_load_scan_store.cu": "cub/block/block_load.cuh " + _THRUST_MACRO_INCLUDE,
    "cub_block_reduce_items.cu": "cub/block/block_load.cuh " + _THRUST_MACRO_INCLUDE,
}


def _cases() -> list:
    cases = []
    for entry in entries():
        marks: list = []
        for arch, target in TARGETS:
            if arch in entry.get("targets", [a for a, _ in TARGETS]):
                cases.append(pytest.param(entry, arch, target, marks=marks,
                                          id=f"{entry['file']}-{arch}"))
    return cases


def test_corpus_has_the_patterns_people_use():
    files = {e["file"] for e in entries()}
    assert len(files) >= 20
    for needed in ("fp16", "bf16", "fp8", "wmma", "cub_block_reduce", "cub_block_scan",
                   "cg_warp_reduce", "grid_sync", "atomic_ref", "complex", "memcpy_async",
                   "llmc_layernorm", "llmc_softmax", "llmc_gelu", "flash_attention", "sgemm",
                   "cub_block_radix_sort", "cub_block_load_scan_store", "wmma_gemm_tiled",
                   "mma_sync", "memcpy_async_pipeline", "transpose", "histogram"):
        assert any(needed in f for f in files), needed


@pytest.mark.parametrize("entry,arch,target", _cases())
def test_corpus_kernel_compiles(entry, arch, target):
    def build():
        return kjit.compile(source(entry), arch=arch, target=target, name=entry["file"],
                            name_expressions=entry.get("name_expressions", ()))

    obj = build()
    assert obj.arch == arch
    for k in entry["kernels"]:
        symbol = obj.lowered_name(k)
        assert symbol in obj.entry_points, (k, obj.entry_points)
    if target == "ptx":
        assert f".target {arch.replace('compute', 'sm')}".encode() in obj.code
    again = build()                                   # the second compile is a cache hit
    if entry["file"] in UNCACHED:
        assert not again.cache_hit, f"{entry['file']} is cached now: take it out of UNCACHED"
        pytest.xfail(UNCACHED[entry["file"]])
    assert again.cache_hit and again.code == obj.code


@pytest.mark.parametrize("entry", [e for e in entries() if e.get("nvcc_prelude")],
                         ids=lambda e: e["file"])
def test_prelude_kernels_need_nothing_else(entry):
    """The kernels that use the prelude also compile, with or without it, once the standard
    headers that declare those names are included, as a user might add them: nothing else
    in them is missing."""
    obj = kjit.compile(EXPLICIT_INCLUDES + source(entry), arch="sm_80", name=entry["file"],
                       name_expressions=entry.get("name_expressions", ()))
    for k in entry["kernels"]:
        assert obj.lowered_name(k) in obj.entry_points, (k, obj.entry_points)
