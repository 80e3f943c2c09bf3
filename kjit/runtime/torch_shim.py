"""PyTorch's C shim for the C packer: the plain C functions AOTInductor's compiled code reads
tensors and the current stream with (`torch/csrc/inductor/aoti_torch/c/shim.h`). Through them
a launch reads a tensor in a few C calls instead of five of PyTorch's Python accessors, each
of which parses its arguments and checks for `__torch_function__`.

They are found in the libraries `torch._C` links and checked once, on the first tensor the
Python path accepts, against PyTorch's own Python answers; the device type and layout codes the
packer compares are taken from that tensor. A PyTorch without the shim, or one whose answers
differ, keeps the packer on the accessors."""
from __future__ import annotations

import ctypes
import sys
from typing import Any

from . import libcuda, torch_facts

_READERS = ("get_data_ptr", "get_dtype", "get_device_type", "get_device_index", "get_layout",
            "is_contiguous", "get_numel", "get_storage_size", "get_storage_offset")
_STREAM = "get_current_cuda_stream"
_state: dict[str, Any] = {}   # "lib": the CDLL or None; "installed": bool


def _library() -> Any | None:
    if "lib" not in _state:
        torch = sys.modules["torch"]
        try:   # a handle on torch._C finds symbols in every library it links
            lib = ctypes.CDLL(torch._C.__file__)
            for name in _READERS:
                fn = getattr(lib, "aoti_torch_" + name)
                fn.restype = ctypes.c_int32
        except (OSError, AttributeError):
            lib = None
        _state["lib"] = lib
    return _state["lib"]


def _ask(lib: Any, name: str, t: Any, ctype: type) -> Any:
    """The shim's answer for tensor `t` (None: it reported an error)."""
    word = ctypes.c_void_p(t._cdata)   # an at::Tensor is this one TensorImpl pointer
    out = ctype()
    if getattr(lib, "aoti_torch_" + name)(ctypes.byref(word), ctypes.byref(out)) != 0:
        return None
    return out.value


def _agrees(lib: Any, t: Any) -> tuple[int, int] | None:
    """(cuda, strided) codes when the shim reads `t` (a dense CUDA tensor) and host tensors as
    PyTorch's Python API does, else None."""
    torch = sys.modules["torch"]
    # on the host, named: a default device or dtype must not change them, and a graph capture
    # may be running on the device
    host = torch.empty((3, 4), device="cpu", dtype=torch.float32)
    view = host[1:]
    cuda = _ask(lib, "get_device_type", t, ctypes.c_int32)
    strided = _ask(lib, "get_layout", t, ctypes.c_int32)
    same = (
        (_ask(lib, "get_data_ptr", t, ctypes.c_void_p) or 0) == t.data_ptr()
        and _ask(lib, "get_device_index", t, ctypes.c_int32) == t.get_device()
        and _ask(lib, "is_contiguous", t, ctypes.c_bool) is True
        and _ask(lib, "is_contiguous", host.t(), ctypes.c_bool) is False
        and _ask(lib, "get_layout", host, ctypes.c_int32) == strided
        and cuda is not None and _ask(lib, "get_device_type", host, ctypes.c_int32) != cuda
        and _ask(lib, "get_dtype", host, ctypes.c_int32)
        != _ask(lib, "get_dtype", torch.empty(2, device="cpu", dtype=torch.float64), ctypes.c_int32)
        and _ask(lib, "get_numel", view, ctypes.c_int64) == view.numel()
        and _ask(lib, "get_storage_offset", view, ctypes.c_int64) == view.storage_offset() == 4
        and _ask(lib, "get_storage_size", view, ctypes.c_int64) == host.untyped_storage().nbytes())
    return (cuda, strided) if same and strided is not None else None


def _stream_reader(lib: Any, device: int) -> int:
    """The address of the shim's current-stream reader when it answers as
    torch._C._cuda_getCurrentRawStream does, else 0 (the packer then calls that getter)."""
    fn = getattr(lib, "aoti_torch_" + _STREAM, None)
    if fn is None:
        return 0
    fn.restype = ctypes.c_int32
    torch = sys.modules["torch"]
    getter = torch._C._cuda_getCurrentRawStream

    def agrees() -> bool:
        out = ctypes.c_void_p()
        return fn(ctypes.c_int32(device), ctypes.byref(out)) == 0 and (out.value or 0) == getter(device)

    # On the default stream both say 0: compare on another one too. The per-thread default
    # stream's handle (2) wrapped as an external stream makes no CUDA call (a capture may run).
    ok = agrees()
    with torch.cuda.stream(torch.cuda.ExternalStream(2, device=device)):
        ok = ok and getter(device) == 2 and agrees()
    return (ctypes.cast(fn, ctypes.c_void_p).value or 0) if ok else 0


def _tensor_offset(t: Any, host: Any) -> int:
    """Where a tensor object holds its at::Tensor, when that is right after the object header
    (PyTorch's THPVariable) in every sample, else 0 (the packer then asks `_cdata`)."""
    torch = sys.modules["torch"]
    offset = object.__basicsize__
    samples = (t, host, torch.nn.Parameter(host, requires_grad=False))
    if all(type(x).__basicsize__ >= offset + ctypes.sizeof(ctypes.c_void_p) and
           ctypes.c_void_p.from_address(id(x) + offset).value == x._cdata for x in samples):
        return offset
    return 0


def install(t: Any) -> bool:
    """Hand the shim to the C packer, checked with `t`: a CUDA tensor that passed every check
    of pointers.tensor_pointer. True when tensors are read through it."""
    if "installed" not in _state:
        _state["installed"] = False
        try:   # a PyTorch that answers otherwise than expected keeps the accessors
            register = libcuda.c_function("register_torch_shim")
            lib = _library() if register is not None else None
            codes = _agrees(lib, t) if lib is not None else None
            if codes is not None:
                addrs = tuple(ctypes.cast(getattr(lib, "aoti_torch_" + n), ctypes.c_void_p).value
                              for n in _READERS)
                offset = _tensor_offset(t, sys.modules["torch"].empty(4, device="cpu"))
                register(addrs, _stream_reader(lib, t.get_device()), *codes, offset)
                _state["installed"] = True
                # then one call in place of these, where it can be built for this PyTorch
                torch_facts.install(t, lambda name, x: _ask(lib, name, x, ctypes.c_int32))
        except Exception:
            pass
    return _state["installed"]


def dtype_code(t: Any) -> int:
    """The shim's code for `t`'s element type, -1 when the shim is not in use or cannot say."""
    if not install(t):
        return -1
    code = _ask(_state["lib"], "get_dtype", t, ctypes.c_int32)
    return -1 if code is None else code
