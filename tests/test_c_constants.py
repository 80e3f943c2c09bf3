"""The numbers Python writes for the C extensions to read (pack kinds, launcher flags,
framework kinds, the destroyed-context mark, the PyTorch shim readers' order, the XLA plan's
kinds) are kept on both sides; each extension exposes its own, and these must agree. Runs on
the CPU: the extensions build without a GPU (python setup.py build_ext --inplace)."""
from __future__ import annotations

import pytest

from kjit.runtime import jax_ffi, kernel, stream, torch_shim
from kjit.runtime.params import K_ARRAY, K_ARRAY_BITS, K_PYTHON, Packer


@pytest.fixture(scope="module")
def ext():
    return pytest.importorskip("kjit.runtime._launch", reason="the C launcher is not built here")


def test_pack_kinds(ext):
    c_names = {("int", 1): "K_I8", ("uint", 1): "K_U8", ("int", 2): "K_I16", ("uint", 2): "K_U16",
               ("int", 4): "K_I32", ("uint", 4): "K_U32", ("int", 8): "K_I64", ("uint", 8): "K_U64",
               ("float", 4): "K_F32", ("float", 8): "K_F64"}
    assert set(Packer._C_KINDS) == set(c_names)
    assert {c_names[k]: v for k, v in Packer._C_KINDS.items()} == \
        {name: getattr(ext, name) for name in c_names.values()}
    assert (K_PYTHON, K_ARRAY, K_ARRAY_BITS) == (ext.K_PYTHON, ext.K_ARRAY, ext.K_ARRAY_BITS)


def test_launcher_flags_and_the_destroyed_context(ext):
    assert (kernel.AUTO_STREAM, kernel.GRAD_OK, kernel.HAS_ARRAYS) == \
        (ext.L_AUTO_STREAM, ext.L_GRAD_OK, ext.L_HAS_ARRAYS)
    assert kernel.NO_CONTEXT == ext.NO_CONTEXT


def test_framework_kinds_and_the_shim_readers_order(ext):
    assert (stream.TORCH, stream.CUPY) == (ext.FOREIGN_TORCH, ext.FOREIGN_CUPY)
    assert torch_shim._READERS == ext.SHIM_READERS


def test_xla_plan_kinds():
    xla = pytest.importorskip("kjit.runtime._xla", reason="the XLA handler is not built here")
    assert (jax_ffi.P_ARG, jax_ffi.P_RET, jax_ffi.P_SCALAR) == (xla.P_ARG, xla.P_RET, xla.P_SCALAR)
