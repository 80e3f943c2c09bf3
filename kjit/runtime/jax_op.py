"""A kjit kernel as a JAX function: `f = kernel.as_jax_op(grid=..., block=..., outputs={"y": "x"})`.

The function's parameters come from the kernel's C signature, in its order: a pointer to const
is an input array (read-only), a pointer named in `outputs` is a result the call allocates
(shape and dtype given, or "like" an input), and a number (int, float, bool of any C width)
is a static value packed with the C type's width, range-checked: a new value traces the call
again, as jax-triton's scalars do. Arrays are checked when the call is traced (element type
against the pointee, `ndim` where declared, a host or CPU array refused), the grid (a tuple, or
a function of the arguments' shapes) is worked out then too, and each refusal names the
parameter. The call is a `jax.ffi.ffi_call` to kjit's handler (jax_ffi.py): it runs eagerly and
under `jax.jit`, on the stream XLA gives it, on the device its arrays are on, and inside XLA's
command buffers. Under `jax.vmap`, `vmap="sequential"` (the default) runs the kernel once per
batch element (`jax.lax.map`); `vmap="broadcast"` calls it once on the whole batch, for kernels
that treat leading dimensions as more elements (the grid and outputs then see batched shapes).
"""
from __future__ import annotations

import inspect
import struct
from typing import Any, Callable, NamedTuple

from ..errors import ArgumentError, KjitError
from . import dtypes, jax_ffi, scalars
from .dims import dim3
from .slots import SCALAR_FORMATS, ParamSlot, check_outputs, pointer_role
from .torch_op import _signature_of

VMAP_METHODS = ("sequential", "broadcast")


class JaxParam(NamedTuple):
    slot: ParamSlot
    kind: str          # "input", "output", "scalar"

    @property
    def name(self) -> str:
        return self.slot.name


def jax_params(slots: tuple | list, kernel: str, outputs: dict) -> list[JaxParam]:
    """Each kernel parameter's role in the JAX function, or ArgumentError for one JAX cannot
    pass (a pointer the kernel may write that is not an output, structs, vectors)."""
    check_outputs(slots, kernel, outputs)
    params = []
    for s in slots:
        c = s.ctype
        if c is not None and c.kind == "pointer":
            kind = pointer_role(s, kernel, outputs)
            if kind == "written":
                raise ArgumentError(
                    f"kernel {kernel}: {s.describe()} is a pointer the kernel may write, but JAX "
                    f"arrays are immutable: name it in outputs (outputs={{'{s.name}': ...}}) for a "
                    "result the call allocates, or declare it const if the kernel only reads it")
        elif c is not None and (c.kind, c.size) in SCALAR_FORMATS and c.kind != "word64":
            kind = "scalar"
        else:
            raise ArgumentError(
                f"kernel {kernel}: {s.describe()} has no JAX type (arrays, ints, floats and bools "
                "do); pass its fields as separate parameters")
        params.append(JaxParam(s, kind))
    if not any(p.kind == "output" for p in params):
        raise ArgumentError(f"kernel {kernel}: a JAX function returns its results; name the "
                            "pointers the kernel writes in outputs, e.g. outputs={'y': 'x'}")
    return params


def typestr(dtype: Any) -> str:
    """kjit's element-type name of a JAX/numpy dtype ("<f4", "bfloat16")."""
    import numpy as np
    d = np.dtype(dtype)
    return d.name if d.name in dtypes.EXTRA else d.str


def _dtype_error(slot: ParamSlot, dtype: Any, what: str) -> ArgumentError:
    want = slot.ctype.typestr   # type: ignore[union-attr]
    name = want if want in dtypes.EXTRA else dtypes.name(want)
    how = f"convert it (x.astype(jnp.{name}))" if what == "the array" else f"declare it {name}"
    return ArgumentError(f"{slot.describe()}: {what} holds {dtype} but the kernel reads {name}; {how}")


class _Checked(NamedTuple):
    arrays: tuple          # the input arrays, in parameter order
    statics: tuple         # (name, value) of each scalar, checked


class JaxOp:
    """The JAX function of one kernel launch configuration (what `as_jax_op` returns)."""

    def __init__(self, target: Any, grid: Any, block: Any, shared_mem: int, outputs: dict,
                 ndim: dict, vmap: str):
        kernel, slots = _signature_of(target)
        self.kernel = kernel
        self.params = jax_params(slots, kernel, outputs)
        self.inputs = [p for p in self.params if p.kind != "output"]
        self.outputs = [p for p in self.params if p.kind == "output"]
        names = [p.name for p in self.inputs]
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        self.__name__ = self.__qualname__ = kernel
        self.__doc__ = f"kernel {kernel} as a JAX function: ({', '.join(names)}) -> " \
                       f"{', '.join(p.name for p in self.outputs)}"
        if vmap not in VMAP_METHODS:
            raise ArgumentError(f"vmap must be one of {VMAP_METHODS}, got {vmap!r}")
        arrays = {p.name for p in self.params if p.kind != "scalar"}
        bad = sorted(set(ndim) - arrays)
        if bad:
            raise ArgumentError(f"kernel {kernel}: ndim names {bad}, which are not its array "
                                f"parameters ({', '.join(sorted(arrays))})")
        for p in self.outputs:
            spec = outputs[p.name]
            if isinstance(spec, str) and spec not in [q.name for q in self.inputs if q.kind == "input"]:
                raise ArgumentError(
                    f"outputs[{p.name!r}] must name an input array to allocate like, be a "
                    f"(shape, dtype) or jax.ShapeDtypeStruct, or a function of the arguments "
                    f"({', '.join(names)}) returning one; got {spec!r}")
        if not isinstance(shared_mem, int) or isinstance(shared_mem, bool) or not 0 <= shared_mem < 2**32:
            raise ArgumentError(f"shared_mem must be a byte count, got {shared_mem!r}")
        self.block = dim3(block, "block") if not callable(block) else block
        self.grid, self.shared_mem, self.specs, self.ndim, self.vmap = grid, shared_mem, outputs, ndim, vmap
        self._jitted: dict[tuple, Callable] = {}
        kinds, wheres, offset = [], [], 0
        for p in self.params:
            if p.kind == "input":
                kinds.append(jax_ffi.P_ARG)
                wheres.append(sum(q.kind == "input" for q in self.params[:p.slot.index]))
            elif p.kind == "output":
                kinds.append(jax_ffi.P_RET)
                wheres.append(self.outputs.index(p))
            else:
                kinds.append(jax_ffi.P_SCALAR)
                wheres.append(offset)
                offset += 8   # each scalar in its own 8 bytes: the driver copies its size
        self._scalar_bytes = max(offset, 8)
        jax_ffi.register()
        self.plan = jax_ffi.Plan(target, kernel, kinds, wheres, len(self.inputs) -
                                 sum(p.kind == "scalar" for p in self.inputs), len(self.outputs))

    def __repr__(self) -> str:
        return f"<kjit JAX op {self.kernel}{self.__signature__}>"

    # --- the call -----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = self.__signature__.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"kernel {self.kernel}: {exc}; its JAX function takes "
                                f"({', '.join(p.name for p in self.inputs)})") from None
        values = [bound.arguments[p.name] for p in self.inputs]
        checked = self._check(values)
        # One jitted function per set of static scalars: an eager call then costs a cache
        # lookup in jax.jit, not a trace of the op (under an outer jit it is inlined).
        fn = self._jitted.get(checked.statics)
        if fn is None:
            import jax
            if len(self._jitted) >= MAX_JITTED:   # each distinct scalar value is a compile
                self._jitted.pop(next(iter(self._jitted)))
            fn = self._jitted[checked.statics] = jax.jit(self._batched(checked.statics))
        return fn(*checked.arrays)

    def _check(self, values: list) -> _Checked:
        import jax
        arrays, statics = [], []
        for p, v in zip(self.inputs, values):
            if p.kind == "scalar":
                statics.append((p.name, self._scalar(p, v)))
                continue
            self._check_array(p, v, jax)
            arrays.append(v)
        return _Checked(tuple(arrays), tuple(statics))

    def _check_array(self, p: JaxParam, v: Any, jax: Any) -> None:
        s = p.slot
        if dtypes.is_numpy(v, "ndarray", "generic"):
            raise ArgumentError(f"{s.describe()}: got a numpy array, which lives on the host; "
                                "pass a JAX array on a GPU (jnp.asarray(x) or jax.device_put(x))")
        if not isinstance(v, jax.Array):
            raise ArgumentError(f"{s.describe()}: expected a JAX array, got {type(v).__name__}")
        if not dtypes.accepts(s.ctype.typestr, typestr(v.dtype)):   # type: ignore[union-attr]
            raise _dtype_error(s, v.dtype, "the array")
        want = self.ndim.get(p.name)
        if want is not None and v.ndim != want:
            raise ArgumentError(f"{s.describe()}: expected an array of {want} dimension(s), got "
                                f"shape {tuple(v.shape)}")
        if not isinstance(v, jax.core.Tracer):   # a concrete array: where it lives is known
            platforms = {d.platform for d in v.devices()}
            if platforms - {"gpu", "cuda"}:
                raise ArgumentError(
                    f"{s.describe()}: the array is on {', '.join(sorted(platforms))}, but the kernel "
                    "runs on a GPU; put it there (jax.device_put(x, jax.devices('gpu')[0]))")

    def _scalar(self, p: JaxParam, v: Any) -> Any:
        import jax
        if isinstance(v, jax.core.Tracer) or isinstance(v, jax.Array):
            raise ArgumentError(
                f"{p.slot.describe()}: a number the kernel takes by value is static in JAX: pass "
                "a Python number (under jax.jit, mark the argument static: static_argnames=...); "
                "a traced or device value cannot reach the launch")
        c = p.slot.ctype
        return scalars.floating(p.slot, v) if c.kind == "float" else scalars.integer(p.slot, v)   # type: ignore[union-attr]

    def _batched(self, statics: tuple) -> Callable:
        import jax
        op = jax.custom_batching.custom_vmap(lambda *arrays: self._bind(arrays, statics))

        @op.def_vmap
        def rule(axis_size: int, in_batched: list, *arrays: Any) -> Any:
            n_out = len(self.outputs)
            if self.vmap == "broadcast":   # one launch on the whole batch
                arrays = tuple(a if b else jax.numpy.broadcast_to(a, (axis_size,) + a.shape)
                               for a, b in zip(arrays, in_batched))
                out = op(*arrays)
            else:   # one launch per batch element, each seeing its own shapes
                which = [i for i, b in enumerate(in_batched) if b]

                def one(xs: tuple) -> Any:
                    full = list(arrays)
                    for i, x in zip(which, xs):
                        full[i] = x
                    return op(*full)
                out = jax.lax.map(one, tuple(arrays[i] for i in which))
            return out, (True if n_out == 1 else [True] * n_out)
        return op

    def _bind(self, arrays: tuple, statics: tuple) -> Any:
        import jax
        import numpy as np
        named = dict(statics)
        it = iter(arrays)
        shapes = {p.name: next(it) if p.kind == "input" else named[p.name] for p in self.inputs}
        out_types = [self._out_type(p, shapes) for p in self.outputs]
        call_args = [shapes[p.name] if p.kind != "output" else out_types[self.outputs.index(p)]
                     for p in self.params]
        grid = self._grid(call_args)
        block = dim3(self.block(*call_args), "block") if callable(self.block) else self.block
        blob = bytearray(self._scalar_bytes)
        for p, off in zip((p for p in self.params if p.kind == "scalar"), range(0, 1 << 30, 8)):
            fmt = "<" + SCALAR_FORMATS[(p.slot.ctype.kind, p.slot.ctype.size)]   # type: ignore[union-attr]
            struct.pack_into(fmt, blob, off, named[p.name])
        self.plan.load_everywhere()
        call = jax.ffi.ffi_call(jax_ffi.TARGET, out_types, vmap_method="sequential")
        outs = call(*arrays, kjit_plan=np.int64(self.plan.index),
                    kjit_dims=np.array(grid + block + (self.shared_mem,), dtype=np.int64),
                    kjit_scalars=np.frombuffer(bytes(blob), dtype=np.uint8))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _out_type(self, p: JaxParam, shapes: dict) -> Any:
        import jax
        spec = self.specs[p.name]
        what = f"outputs[{p.name!r}]"
        if isinstance(spec, str):
            like = shapes[spec]
            t = jax.ShapeDtypeStruct(like.shape, like.dtype)
        else:
            if callable(spec) and not isinstance(spec, jax.ShapeDtypeStruct):
                try:
                    spec = spec(*(shapes[q.name] for q in self.inputs))
                except ArgumentError:
                    raise
                except Exception as exc:
                    raise ArgumentError(f"kernel {self.kernel}: {what}'s function refused the "
                                        f"arguments ({_shapes(shapes)}): {exc}") from None
                what += "'s function"
            if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[0], int):
                spec = jax.ShapeDtypeStruct(tuple(spec[0]), spec[1])
            if not hasattr(spec, "shape") or not hasattr(spec, "dtype"):
                raise ArgumentError(f"{what} must give a (shape, dtype) or jax.ShapeDtypeStruct, "
                                    f"got {spec!r}")
            t = jax.ShapeDtypeStruct(tuple(spec.shape), spec.dtype)
        if not dtypes.accepts(p.slot.ctype.typestr, typestr(t.dtype)):   # type: ignore[union-attr]
            raise _dtype_error(p.slot, t.dtype, f"the result ({what})")
        want = self.ndim.get(p.name)
        if want is not None and len(t.shape) != want:
            raise ArgumentError(f"{p.slot.describe()}: expected a result of {want} dimension(s), "
                                f"{what} gives shape {t.shape}")
        return t

    def _grid(self, call_args: list) -> tuple:
        grid = self.grid
        if callable(grid):
            try:
                grid = grid(*call_args)
            except ArgumentError:
                raise
            except Exception as exc:
                shapes = {p.name: a for p, a in zip(self.params, call_args)}
                raise ArgumentError(f"kernel {self.kernel}: the grid function refused the "
                                    f"arguments ({_shapes(shapes)}): {exc}") from None
        return dim3(grid, f"kernel {self.kernel}: the grid")


MAX_JITTED = 256   # jitted functions an op keeps (distinct static scalar values)


def _shapes(values: dict) -> str:
    return ", ".join(f"{n}: {v.dtype}{list(v.shape)}" if hasattr(v, "shape") else f"{n}={v!r}"
                     for n, v in values.items())


def as_jax_op(target: Any, *, grid: Any, block: Any, shared_mem: int = 0,
              outputs: dict[str, Any] | None = None, ndim: dict[str, int] | None = None,
              vmap: str = "sequential") -> JaxOp:
    """`target` (a Kernel or an @kjit.kernel function) as a JAX function of its inputs and
    scalars (in parameter order, or by name) returning its outputs. `outputs` maps each
    pointer the kernel writes to the result the call allocates: the name of an input to be
    like (same shape and dtype), a (shape, dtype) or jax.ShapeDtypeStruct, or a function of
    the arguments returning one. `grid` is a tuple or a function of the kernel's arguments in
    parameter order (arrays as shapes/dtypes, outputs included) returning one; `block` the
    same. `ndim` gives array parameters' required number of dimensions. `vmap`: "sequential"
    (a launch per batch element) or "broadcast" (one launch on the batch)."""
    try:
        import jax  # noqa: F401
    except ImportError:
        raise KjitError("as_jax_op needs JAX: pip install 'kjit[jax]' (and jax[cuda13] for the "
                        "GPU)") from None
    return JaxOp(target, grid, block, shared_mem, dict(outputs or {}), dict(ndim or {}), vmap)
