"""The corpus (tests/corpus): every kernel compiles with no -I, through the toolkit and CCCL
headers from the wheels, for sm_80, sm_90 and sm_100 and to PTX, and provides the kernels
its index entry names. (CPU; tests/test_corpus_gpu.py runs them.)"""
from __future__ import annotations

import pytest

import kjit
from corpus import entries, source

TARGETS = [("sm_80", "cubin"), ("sm_90", "cubin"), ("sm_100", "cubin"), ("compute_80", "ptx")]


def test_corpus_has_the_patterns_people_use():
    files = {e["file"] for e in entries()}
    assert len(files) >= 10
    for needed in ("fp16", "bf16", "fp8", "wmma", "cub_block_reduce", "cub_block_scan",
                   "cg_warp_reduce", "grid_sync", "atomic_ref", "complex", "memcpy_async"):
        assert any(needed in f for f in files), needed


@pytest.mark.parametrize("arch,target", TARGETS, ids=[a for a, _ in TARGETS])
@pytest.mark.parametrize("entry", entries(), ids=lambda e: e["file"])
def test_corpus_kernel_compiles(entry, arch, target):
    obj = kjit.compile(source(entry), arch=arch, target=target, name=entry["file"],
                       name_expressions=entry.get("name_expressions", ()))
    assert obj.arch == arch
    for k in entry["kernels"]:
        symbol = obj.lowered_name(k)
        assert symbol in obj.entry_points, (k, obj.entry_points)
    if target == "ptx":
        assert f".target {arch.replace('compute', 'sm')}".encode() in obj.code
