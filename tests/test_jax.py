"""A kjit kernel as a JAX function, what needs no GPU: the parameters' roles from the C
signature, output shapes, the grid, the static scalars' bytes, trace-time refusals naming the
parameter, the vmap rule, XLA really calling kjit's handler (on the CPU, where it refuses the
call), and kjit's declarations of XLA's FFI ABI against jaxlib's own c_api.h."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'kjit[jax]')")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import kjit  # noqa: E402
from kjit.errors import ArgumentError, KjitError  # noqa: E402

SCALE = r'''
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}'''


@kjit.kernel(arch="sm_80")
def scale():
    return SCALE


@kjit.kernel(arch="sm_80")
def mixed():
    return r'''
    extern "C" __global__ void mixed(const float* x, const int* idx, float* y, int* count,
                                     unsigned char flag, short s, double d, bool b) {}'''


def grid_of(x, y, a, n):
    return (kjit.cdiv(x.size, 128),)


def op(**kw):
    kw.setdefault("grid", grid_of)
    kw.setdefault("block", 128)
    kw.setdefault("outputs", {"y": "x"})
    return scale.as_jax_op(**kw)


X = jax.ShapeDtypeStruct((1000,), jnp.float32)


def custom_call(f, *args) -> str:
    text = jax.jit(f).lower(*args).as_text()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call @kjit_launch" in line]
    assert len(calls) == 1, text
    return calls[0]


def attr(line: str, name: str) -> list[int]:
    m = re.search(rf"{name} = dense<\[?([-\d, ]+)\]?>", line)
    assert m, line
    return [int(v) for v in m.group(1).split(",")]


# --- the function's parameters ---------------------------------------------------------------
def test_parameters_come_from_the_c_signature_outputs_excluded():
    f = op()
    assert list(f.__signature__.parameters) == ["x", "a", "n"]
    assert "scale(x, a, n)" in repr(f)
    g = mixed.as_jax_op(grid=1, block=1, outputs={"y": "x", "count": ((1,), jnp.int32)})
    assert list(g.__signature__.parameters) == ["x", "idx", "flag", "s", "d", "b"]


@pytest.mark.parametrize("outputs, words", [
    ({}, ["'y'", "immutable", "outputs"]),
    ({"y": "x", "x": "x"}, ["'x'", "points to const"]),
    ({"y": "x", "z": "x"}, ["['z']", "not its parameters"]),
    ({"y": "q"}, ["outputs['y']", "'q'"]),
])
def test_roles_the_kernel_cannot_have_are_refused_naming_the_parameter(outputs, words):
    with pytest.raises(ArgumentError) as exc:
        scale.as_jax_op(grid=1, block=1, outputs=outputs)
    for w in words:
        assert w in str(exc.value)


def test_bad_options_are_refused_when_the_op_is_made():
    with pytest.raises(ArgumentError, match="vmap must be one of"):
        op(vmap="parallel")
    with pytest.raises(ArgumentError, match="ndim names"):
        op(ndim={"a": 1})
    with pytest.raises(ArgumentError, match="block"):
        op(block=(0,))


# --- shapes and the grid ------------------------------------------------------------------
@pytest.mark.parametrize("spec, shape, dtype", [
    ("x", (1000,), jnp.float32),
    (((10, 100), jnp.float32), (10, 100), jnp.float32),
    (jax.ShapeDtypeStruct((7,), jnp.float32), (7,), jnp.float32),
    (lambda x, a, n: jax.ShapeDtypeStruct((n,), x.dtype), (33,), jnp.float32),
])
def test_outputs_by_input_shape_dtype_or_function(spec, shape, dtype):
    f = op(outputs={"y": spec}, grid=(1,))
    out = jax.eval_shape(lambda x: f(x, 2.0, 33), X)
    assert out.shape == shape and out.dtype == dtype


def test_grid_function_sees_the_arguments_and_sets_the_launch():
    seen = []

    def grid(x, y, a, n):
        seen.append((x.shape, y.shape, a, n))
        return (kjit.cdiv(n, 64), 2)
    f = op(grid=grid, block=(64, 1, 1), shared_mem=512)
    line = custom_call(lambda x: f(x, 2.0, 1000), X)
    assert seen == [((1000,), (1000,), 2.0, 1000)]
    assert attr(line, "kjit_dims") == [16, 2, 1, 64, 1, 1, 512]


def test_scalars_are_packed_with_their_c_types_and_are_static():
    g = mixed.as_jax_op(grid=1, block=32, outputs={"y": ((4,), jnp.float32), "count": ((1,), jnp.int32)})
    x, idx = jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32)
    line = custom_call(lambda x, i: g(x, i, 255, -3, 0.5, True), x, idx)
    blob = bytes(v & 0xFF for v in attr(line, "kjit_scalars"))
    assert struct.unpack_from("<B", blob, 0) == (255,)
    assert struct.unpack_from("<h", blob, 8) == (-3,)
    assert struct.unpack_from("<d", blob, 16) == (0.5,)
    assert struct.unpack_from("<?", blob, 24) == (True,)
    # a new value is a new trace, as jax-triton's scalars: no stale launch
    calls = []
    f = op(grid=lambda x, y, a, n: calls.append(n) or (1,))
    h = jax.jit(lambda x, n: f(x, 2.0, n), static_argnums=1)
    h.lower(X, 10)
    h.lower(X, 20)
    assert calls == [10, 20]


# --- trace-time refusals naming the parameter ---------------------------------------------
@pytest.mark.parametrize("call, words", [
    (lambda f: jax.eval_shape(lambda x: f(x, 2.0, 8), jax.ShapeDtypeStruct((8,), jnp.int32)),
     ["parameter 0 'x'", "int32", "float32"]),
    (lambda f: jax.eval_shape(lambda x: f(x, 2.0, 8), jax.ShapeDtypeStruct((2, 4), jnp.float32)),
     ["parameter 0 'x'", "1 dimension", "(2, 4)"]),
    (lambda f: f(np.ones(8, np.float32), 2.0, 8), ["parameter 0 'x'", "numpy", "host"]),
    (lambda f: f(jnp.ones(8, jnp.float32), 2.0, 8), ["parameter 0 'x'", "on cpu", "GPU"]),
    (lambda f: jax.eval_shape(lambda x, a: f(x, a, 8), X, 2.0), ["parameter 2 'a'", "static"]),
    (lambda f: jax.eval_shape(lambda x: f(x, 2.0, 2**40), X), ["parameter 3 'n'", "does not fit"]),
    (lambda f: jax.eval_shape(lambda x: f(x, 2.0), X), ["missing", "'n'"]),
    (lambda f: jax.eval_shape(lambda x: f([1.0], 2.0, 8), X), ["parameter 0 'x'", "list"]),
])
def test_bad_input_is_refused_at_trace_time_naming_the_parameter(call, words):
    f = op(ndim={"x": 1})
    with pytest.raises(ArgumentError) as exc:
        call(f)
    for w in words:
        assert w in str(exc.value)


def test_a_shape_the_grid_function_rejects_is_refused_with_the_shapes():
    def grid(x, y, a, n):
        if x.size % 4:
            raise ValueError("x.size must be a multiple of 4")
        return (1,)
    f = op(grid=grid)
    with pytest.raises(ArgumentError) as exc:
        jax.eval_shape(lambda x: f(x, 2.0, 7), jax.ShapeDtypeStruct((7,), jnp.float32))
    assert "grid function refused" in str(exc.value) and "x: float32[7]" in str(exc.value)
    assert "multiple of 4" in str(exc.value)
    with pytest.raises(ArgumentError, match="grid"):
        jax.eval_shape(lambda x: op(grid=lambda *a: (0,))(x, 2.0, 7), X)


def test_an_output_of_the_wrong_dtype_is_refused():
    f = op(outputs={"y": ((8,), jnp.int32)}, grid=1)
    with pytest.raises(ArgumentError, match=r"parameter 1 'y'.*int32.*float32"):
        jax.eval_shape(lambda x: f(x, 2.0, 8), X)


# --- vmap ---------------------------------------------------------------------------------
def test_vmap_sequential_launches_per_element_broadcast_once_on_the_batch():
    shapes = []

    def grid(x, y, a, n):
        shapes.append(x.shape)
        return (1,)
    xb = jax.ShapeDtypeStruct((3, 1000), jnp.float32)
    text = jax.jit(jax.vmap(lambda x: op(grid=grid)(x, 2.0, 1000))).lower(xb).as_text()
    assert set(shapes) == {(1000,)}   # each launch sees one element
    assert "stablehlo.while" in text and "(tensor<1000xf32>) -> tensor<1000xf32>" in text
    shapes.clear()
    text = jax.jit(jax.vmap(lambda x: op(grid=grid, vmap="broadcast")(x, 2.0, 3000))).lower(xb).as_text()
    assert (3, 1000) in shapes and text.count("@kjit_launch") == 1
    assert "(tensor<3x1000xf32>) -> tensor<3x1000xf32>" in text


def test_the_custom_vjp_example_traces_forward_and_backward_kernels():
    import runpy
    from pathlib import Path
    example = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "jax_train.py"))
    x = jnp.linspace(-1, 1, 256, dtype=jnp.float32)
    loss = lambda w: (example["smooth_relu"](w * x) ** 2).sum()   # noqa: E731  (needs the forward)
    text = jax.jit(jax.grad(loss)).lower(jnp.float32(0.5)).as_text()
    assert text.count("@kjit_launch") == 2   # the forward kernel and the backward one


# --- XLA calls kjit's handler -------------------------------------------------------------
def test_xla_registers_and_calls_the_handler_which_refuses_the_cpu():
    f = op()
    with pytest.raises(Exception) as exc:   # jax's runtime error: its class moved across versions
        jax.block_until_ready(jax.jit(lambda x: f(x, 2.0, 8))(jnp.ones(8, jnp.float32)))
    assert "kernel scale is a CUDA kernel" in str(exc.value)


def test_the_framework_api_version_is_read_from_jaxlib_and_checked(tmp_path):
    from kjit.runtime import jax_ffi
    major, minor = jax_ffi.framework_api_version()
    assert major == 0 and minor >= 1
    jax_ffi.check_api_version((0, minor))
    with pytest.raises(KjitError, match="1.0"):
        jax_ffi.check_api_version((1, 0))
    with pytest.raises(KjitError, match="not readable"):
        jax_ffi.framework_api_version(str(tmp_path))


def test_kjits_abi_declarations_match_jaxlibs_c_api_h(tmp_path):
    from kjit.runtime import jax_ffi
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the ABI probe")
    abi = jax_ffi.extension().abi()
    lines = []
    for key in abi:
        if "." in key:
            struct_, field = key.split(".")
            lines.append(f'printf("{key} %zu\\n", offsetof({struct_}, {field}));')
        elif key.endswith("_STRUCT_SIZE"):
            lines.append(f'printf("{key} %zu\\n", (size_t){key});')
        else:
            lines.append(f'printf("{key} %zu\\n", sizeof({key}));')
    (tmp_path / "probe.c").write_text('#include <stddef.h>\n#include <stdio.h>\n'
                                      '#include "xla/ffi/api/c_api.h"\nint main(void) {\n'
                                      + "\n".join(lines) + "\nreturn 0;\n}\n")
    build = subprocess.run([cc, "-I", jax.ffi.include_dir(), str(tmp_path / "probe.c"), "-o",
                            str(tmp_path / "probe")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True).stdout
    real = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert {k: abi[k] for k in real} == real and len(real) == len(abi)


def test_import_kjit_never_imports_jax():
    code = ("import sys, kjit; kjit.kernel; kjit.Kernel; import kjit.runtime.kernel; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_kernel_of_too_many_parameters_is_refused_naming_it():
    # refused before the handler's table is asked (which would raise a bare ValueError)
    from kjit.runtime.jax_ffi import Plan
    with pytest.raises(ArgumentError, match=r"kernel wide: 132 parameters.*at most 128"):
        Plan(None, "wide", [2] * 132, list(range(132)), 1, 1)
