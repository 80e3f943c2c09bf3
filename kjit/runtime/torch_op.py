"""A kjit kernel as a PyTorch operator: `kernel.as_torch_op("mylib::saxpy", grid=..., block=...)`.

The operator's schema comes from the kernel's C signature: a pointer to const is an input
tensor, any other pointer a tensor the kernel writes (`Tensor(a!)`, a mutated argument) or,
named in `outputs`, a tensor the operator allocates and returns; integer parameters are
`SymInt`, floating-point ones `float`, `bool` is `bool`. It is defined with
`torch.library.Library.define` and implemented for CUDA by a generated function that computes
the grid and launches on PyTorch's current stream (so a CUDA-graph capture records it); a fake
implementation (shapes only, no GPU work) lets torch.compile trace it with fullgraph=True, and
a backward is attached with torch.library.register_autograd on an operator with outputs.
PyTorch is imported only here, when an operator is made.
"""
from __future__ import annotations

import keyword
import re
from typing import Any, Callable, NamedTuple

from ..errors import ArgumentError
from .cdecl import parse_signatures
from .pointers import tensor_pointer
from .slots import ParamSlot, check_outputs, pointer_role
from .stream import OPERATOR_STREAM


class OpParam(NamedTuple):
    slot: ParamSlot
    kind: str          # "input", "mutated", "output", "int", "float", "bool"

    @property
    def name(self) -> str:
        return self.slot.name


_SCALARS = {"int": "SymInt", "uint": "SymInt", "float": "float", "bool": "bool"}
_QUALNAME = re.compile(r"^([A-Za-z_]\w*)::([A-Za-z_]\w*)$")
_libraries: dict[str, Any] = {}   # namespace -> torch.library.Library, kept for the process
_defined: dict[str, tuple[str, dict]] = {}   # "ns::name" -> (schema, the impl's globals)


def operator_params(slots: tuple | list, kernel: str, outputs: dict | None) -> list[OpParam]:
    """Each kernel parameter's role in the operator, or ArgumentError for one PyTorch cannot
    pass (structs, vectors, pointers of unknown type)."""
    outputs = dict(outputs or {})
    check_outputs(slots, kernel, outputs)
    params = []
    for s in slots:
        c = s.ctype
        if c is not None and c.kind == "pointer":
            kind = pointer_role(s, kernel, outputs)
            kind = "mutated" if kind == "written" else kind
        elif c is not None and c.kind in _SCALARS:
            kind = c.kind if c.kind != "uint" else "int"
        else:
            raise ArgumentError(
                f"kernel {kernel}: {s.describe()} has no PyTorch operator type (tensors, ints, "
                "floats and bools do); pass its fields as separate parameters, or launch the "
                "kernel directly")
        if keyword.iskeyword(s.name):
            raise ArgumentError(f"kernel {kernel}: parameter name {s.name!r} is a Python keyword; "
                                "rename it in the kernel source")
        params.append(OpParam(s, kind))
    return params


def schema(params: list[OpParam]) -> str:
    """The operator's argument list and returns, e.g. "(float a, Tensor x, Tensor(a!) y,
    SymInt n) -> ()"."""
    args, letters = [], iter("abcdefghijklmnopqrstuvwxyz")
    for p in params:
        if p.kind == "input":
            args.append(f"Tensor {p.name}")
        elif p.kind == "mutated":
            args.append(f"Tensor({next(letters)}!) {p.name}")
        elif p.kind != "output":
            args.append(f"{_SCALARS[p.kind]} {p.name}")
    n_out = sum(p.kind == "output" for p in params)
    ret = "()" if n_out == 0 else "Tensor" if n_out == 1 else f"({', '.join(['Tensor'] * n_out)})"
    return f"({', '.join(args)}) -> {ret}"


def check_tensors(params: list[OpParam], args: tuple, device: int | None,
                  fake: bool = False) -> None:
    """The checks a launch makes, at trace time on fake tensors (no GPU work): element type,
    density, and a CUDA device (fake or meta tensors stand in for one)."""
    for p, a in zip((p for p in params if p.kind != "output"), args):
        if p.kind not in ("input", "mutated"):
            continue
        if fake and a.device.type in ("cuda", "meta"):   # no current device while tracing
            tensor_pointer(p.slot, a, a.device.index or 0, grad_ok=True, check_only=True)
            continue
        tensor_pointer(p.slot, a, device if device is not None else 0, grad_ok=True,
                       check_only=True)


def _allocator(spec: Any, p: OpParam, inputs: list[OpParam]) -> Callable:
    """outputs["y"]: the name of an input tensor to allocate like (torch.empty_like, dense),
    or a function of the operator's arguments returning the new tensor."""
    import torch
    if callable(spec):
        return spec
    names = [q.name for q in inputs]
    if spec not in [q.name for q in inputs if q.kind in ("input", "mutated")]:
        raise ArgumentError(
            f"outputs[{p.name!r}] must name an input tensor to allocate like, or be a function "
            f"of the operator's arguments ({', '.join(names)}) returning a new tensor; got {spec!r}")
    i = names.index(spec)
    return lambda *args: torch.empty_like(args[i], memory_format=torch.contiguous_format)


def _impl_source(params: list[OpParam], grid_is_fn: bool) -> str:
    inputs = [p.name for p in params if p.kind != "output"]
    outs = [p.name for p in params if p.kind == "output"]
    call = ", ".join(p.name for p in params)
    lines = [f"def impl({', '.join(inputs)}):"]
    for o in outs:
        lines.append(f"    {o} = ALLOC_{o}({', '.join(inputs)})")
    if grid_is_fn:
        lines.append(f"    LOOKUP(TARGET, (GRID({call}), BLOCK, STREAM, SHARED))({call})")
    else:
        lines.append(f"    LOOKUP(TARGET, CONFIG)({call})")
    if outs:
        lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}")
    return "\n".join(lines) + "\n"


def _fake_source(params: list[OpParam]) -> str:
    inputs = [p.name for p in params if p.kind != "output"]
    outs = [p.name for p in params if p.kind == "output"]
    lines = [f"def fake({', '.join(inputs)}):",
             f"    CHECK(PARAMS, ({', '.join(inputs)}{',' if len(inputs) == 1 else ''}), None, True)"]
    for o in outs:
        lines.append(f"    {o} = ALLOC_{o}({', '.join(inputs)})")
    if outs:
        lines.append(f"    return {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}")
    return "\n".join(lines) + "\n"


def _lookup(target: Any) -> Callable:
    """`target[config]` as the C lookup of kjit's extension where it is built: once Dynamo is
    imported the kernel classes' own __getitem__ is a Python function (torch_compile.py),
    and an operator's implementation, which Dynamo never traces, need not pay for it."""
    for cls in type(target).__mro__:
        if cls.__module__ == "kjit.runtime._launch":
            return cls.__getitem__
    return type(target).__getitem__


def _signature_of(target: Any) -> tuple[str, tuple]:
    """(kernel name, parameter slots) of a Kernel or an @kjit.kernel function: the latter from
    its source's extern "C" signature, else (templates) from the kernel loaded here."""
    params = getattr(target, "params", None)
    if isinstance(params, tuple):   # a loaded Kernel
        return target.name, params
    sig = parse_signatures(target.source()).get(target.name)
    if sig is None or any(p.ctype is None for p in sig.params):
        return target.name, target.kernel().params
    return target.name, tuple(ParamSlot(i, p.name, 0, p.ctype.size, p.ctype)
                              for i, p in enumerate(sig.params))


def as_torch_op(target: Any, name: str, *, grid: Any, block: Any, shared_mem: int = 0,
                outputs: dict[str, Any] | None = None) -> Any:
    """Define the PyTorch operator `name` ("namespace::op") that launches `target` (a Kernel or
    an @kjit.kernel function) with `grid` (a tuple, or a function of the kernel's arguments in
    its parameter order returning one) and `block`. `outputs` maps non-const pointer
    parameters to what the operator allocates and returns instead of taking them: the name
    of an input tensor to allocate like, or a function of the operator's arguments. Returns
    the operator (torch.ops.namespace.op.default). Defining the same name again with the same
    schema re-targets it; another schema is refused."""
    import torch
    m = _QUALNAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise ArgumentError(f"an operator name is 'namespace::name' (identifiers), e.g. "
                            f"'mylib::saxpy'; got {name!r}")
    ns, opname = m.groups()
    kernel, slots = _signature_of(target)
    params = operator_params(slots, kernel, outputs)
    sig = schema(params)
    inputs = [p for p in params if p.kind != "output"]
    names: dict[str, Any] = {
        "TARGET": target, "LOOKUP": _lookup(target), "GRID": grid, "BLOCK": block, "STREAM": OPERATOR_STREAM,
        "SHARED": shared_mem, "CONFIG": (grid, block, OPERATOR_STREAM, shared_mem),
        "CHECK": check_tensors, "PARAMS": params}
    for p in params:
        if p.kind == "output":
            names[f"ALLOC_{p.name}"] = _allocator(outputs[p.name], p, inputs)   # type: ignore[index]
    previous = _defined.get(name)
    if previous is not None:
        if previous[0] != sig:
            raise ArgumentError(
                f"operator {name} is already defined with schema {previous[0]}; this kernel "
                f"gives {sig}. PyTorch operators cannot be redefined: pick another name")
        previous[1].update(names)   # the same operator, now launching this kernel this way
        return getattr(getattr(torch.ops, ns), opname).default
    lib = _libraries.get(ns)
    if lib is None:
        lib = _libraries[ns] = torch.library.Library(ns, "FRAGMENT")
    try:
        lib.define(opname + sig)
    except RuntimeError as exc:
        raise ArgumentError(f"PyTorch refused to define operator {name}{sig}: "
                            f"{str(exc).splitlines()[0]}. Pick another name") from None
    for what, src in (("impl", _impl_source(params, callable(grid))), ("fake", _fake_source(params))):
        exec(compile(src, f"<kjit operator {name} {what}>", "exec"), names)
    lib.impl(opname, names["impl"], "CUDA")
    refuse = _refusal(params, name)
    for key in _REFUSED_KEYS:
        lib.impl(opname, refuse, key)
    torch.library.register_fake(name, names["fake"], lib=lib)
    _defined[name] = (sig, names)
    return getattr(getattr(torch.ops, ns), opname).default


# the backends a tensor a kernel cannot read dispatches to: kjit's checks say why, naming the
# parameter, where PyTorch would only say that the operator has no kernel for the backend
_REFUSED_KEYS = ("CPU", "SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA")


def _refusal(params: list[OpParam], name: str) -> Callable:
    def refuse(*args: Any) -> None:
        check_tensors(params, args, 0)   # names the first such tensor and what to do
        raise ArgumentError(f"operator {name} runs a GPU kernel; its tensors must be dense "
                            "and on a CUDA device")
    return refuse
