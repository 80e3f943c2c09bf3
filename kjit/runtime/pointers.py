"""Pointer parameters: kjit arrays, foreign device arrays (`__cuda_array_interface__`,
`__dlpack__`), In/Out host copies and raw `kjit.ptr` addresses, each checked for element type,
contiguity and device before a launch."""
from __future__ import annotations

import math
import sys
from typing import Any

from ..errors import ArgumentError
from . import dtypes, libcuda
from .dtypes import is_numpy
from .memory import DeviceArray, _c_strides, _HostTransfer, array_interface
from .slots import ParamSlot


class ptr:
    """A raw device pointer passed to a pointer parameter: `kjit.ptr(0x7f...)`."""

    __slots__ = ("value",)

    def __init__(self, value: int):
        if isinstance(value, bool) or not (isinstance(value, int) or is_numpy(value, "integer")) \
                or value < 0:
            raise ArgumentError(f"kjit.ptr takes a non-negative int address, got {value!r}")
        self.value = int(value)

    def __repr__(self) -> str:
        return f"kjit.ptr({self.value:#x})"


def pointer(slot: ParamSlot, value: Any, device: int, pending: list) -> int:
    if isinstance(value, ptr):
        return value.value
    if isinstance(value, DeviceArray):
        check_array(slot, value.typestr, value.is_c_contiguous, value.device, device)
        return value.ptr
    if isinstance(value, _HostTransfer):
        check_array(slot, value.array.dtype.str, True, device, device)
        check_capturable(slot, value, getattr(pending, "stream", None))
        dev = value.to_device()
        pending.append((value, dev))
        return dev.ptr
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return tensor_pointer(slot, value, device)
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        data, _readonly = cai["data"]
        typestr, _itemsize, _nbytes, contiguous = array_layout(cai)
        check_array(slot, typestr, contiguous,
                    foreign_device(value, int(data or 0), getattr(pending, "stream", None)), device)
        learn_foreign(value, typestr)
        return int(data or 0)
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__") and \
            not is_numpy(value, "ndarray"):
        from .dlpack import describe
        try:
            data, typestr, itemsize, shape, strides, dev_id = describe(value)
        except ArgumentError as exc:
            raise ArgumentError(f"{slot.describe()}: {exc}") from None
        contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize)
        check_array(slot, typestr, contiguous, dev_id, device)
        return data
    if is_numpy(value, "ndarray"):
        raise ArgumentError(
            f"{slot.describe()}: got a host numpy array; copy it first with kjit.to_device(x), or "
            "wrap it in kjit.In(x) / kjit.Out(x) / kjit.InOut(x) to copy around the launch")
    if (isinstance(value, int) or is_numpy(value, "integer")) and not isinstance(value, bool):
        raise ArgumentError(
            f"{slot.describe()}: got the int {int(value)}; pass raw addresses as kjit.ptr(address) "
            "so an integer is never taken for a pointer by mistake")
    raise ArgumentError(
        f"{slot.describe()}: expected a device array (kjit.DeviceArray, CuPy, PyTorch, anything "
        f"with __cuda_array_interface__ or __dlpack__) or kjit.ptr, got {type(value).__name__}")


def torch_typestr(dtype: Any) -> str | None:
    """kjit's typestr of a torch.dtype, None for those kjit has no element type for (the fnuz
    float8s...)."""
    name = str(dtype).rpartition(".")[2]   # torch's dtype names are numpy's and ml_dtypes'
    hit = dtypes._COMMON.get(name)
    return hit[0] if hit else name if name in dtypes.EXTRA else None


def tensor_pointer(slot: ParamSlot, t: Any, device: int, grad_ok: bool = False,
                   check_only: bool = False) -> int:
    """A PyTorch tensor's address, after the checks a kernel needs, each naming the parameter
    and saying what to do: on a CUDA device, the kernel's; of the element type the kernel
    reads; dense; not part of an autograd graph (a launch is invisible to autograd).
    `check_only`: the checks alone (a fake tensor while tracing has no address)."""
    where = t.device
    if check_only and where.type == "meta":   # tracing on meta tensors: any device will do
        where = type(where)("cuda", device)
    if where.type != "cuda":
        raise ArgumentError(
            f"{slot.describe()}: got a tensor on {where} ({t.dtype}), but the kernel reads GPU "
            f"memory. Move it to the GPU first: x.to('cuda:{device}') (or create it there)")
    if where.index is not None and where.index != device:
        raise ArgumentError(
            f"{slot.describe()}: the tensor is on cuda:{where.index} but this launch runs on "
            f"device {device} (where its other arguments or its stream are). Move it with "
            f"x.to('cuda:{device}')")
    want = slot.ctype.typestr if slot.ctype.kind == "pointer" else None
    typestr = torch_typestr(t.dtype)
    if want is not None and not dtypes.accepts(want, typestr):
        name = dtypes.name(want)
        how = (f"pass its bits: x.view(torch.{name})" if dtypes.BITS.get(typestr) == want else
               f"convert it: x.to(torch.{name})")
        raise ArgumentError(
            f"{slot.describe()}: the tensor holds {t.dtype} but the kernel reads {name}; {how}")
    if typestr is None:
        raise ArgumentError(f"{slot.describe()}: kjit has no element type for {t.dtype}; pass "
                            "kjit.ptr(x.data_ptr()) to a pointer of the matching C type")
    if t.is_nested:
        raise ArgumentError(
            f"{slot.describe()}: the tensor is nested, but the kernel reads a dense array; pass "
            "torch.nested.to_padded_tensor(x, 0), or x.values() for a jagged tensor's packed "
            "elements")
    if t.layout != sys.modules["torch"].strided:
        raise ArgumentError(
            f"{slot.describe()}: the tensor is {t.layout}, but the kernel reads a dense array; "
            "pass x.to_dense() (and x.contiguous() if it is a view)")
    if not t.is_contiguous():
        raise ArgumentError(
            f"{slot.describe()}: the tensor is not C-contiguous (a strided view, shape "
            f"{tuple(t.shape)}, strides {t.stride()}); the kernel would read it as dense memory. "
            "Pass x.contiguous(), or kjit.ptr(x.data_ptr()) if the kernel handles the strides")
    if t.is_conj() or t.is_neg():
        what, fix = ("conjugate", "resolve_conj") if t.is_conj() else ("negative", "resolve_neg")
        raise ArgumentError(
            f"{slot.describe()}: the tensor is a lazy {what} view, whose memory holds the values "
            f"before the {what}; pass x.{fix}()")
    if t.requires_grad and not grad_ok:
        raise ArgumentError(
            f"{slot.describe()}: the tensor requires grad, and a kernel launch is invisible to "
            "autograd. Pass x.detach() if no gradient flows through this kernel; to give it a "
            "backward, make it an operator: kernel.as_torch_op(...) and "
            "torch.library.register_autograd")
    if check_only:
        return 0
    address = _tensor_address(slot, t)
    learn_foreign(t, typestr)
    return address


def _tensor_address(slot: ParamSlot, t: Any) -> int:
    """A dense tensor's address, once its elements are known to lie in its storage and the
    storage to have memory."""
    no_memory = (f"{slot.describe()}: the tensor has no memory a kernel can read (a tensor of a "
                 "torch.func transform: functionalize, vmap, grad)")
    what_to_do = "Launch outside the transform, or make the kernel an operator: kernel.as_torch_op(...)"
    try:
        address, storage = t.data_ptr(), t.untyped_storage()
        nbytes, base = storage.nbytes(), storage.data_ptr()
    except RuntimeError as exc:
        raise ArgumentError(f"{no_memory}: {str(exc).splitlines()[0]}. {what_to_do}") from None
    if not t.numel():
        return address
    if (t.storage_offset() + t.numel()) * t.element_size() > nbytes:
        raise ArgumentError(
            f"{slot.describe()}: the tensor's {t.numel()} elements do not lie in its storage, "
            f"which holds {nbytes} bytes (resized with untyped_storage().resize_()?); pass a "
            "tensor whose storage holds its data")
    if not base:
        raise ArgumentError(f"{no_memory}. {what_to_do}")
    return address


# Array types the C packer reads itself once it has seen one (kjit/runtime/_foreign.c): a
# torch.Tensor or Parameter through PyTorch's C shim (torch_shim.py), a tensor subclass through
# data_ptr() / is_contiguous() / get_device() / requires_grad, a CuPy array through its fields
# read in place (cupy_capi.py) or else .data.ptr / .data.device_id / ._c_contiguous; .dtype
# through the table below. Complex tensors stay here,
# where a lazy conjugate is told apart.
_learned: set = set()
_frameworks_registered: set = set()


def array_layout(cai: dict) -> tuple[str, int, int, bool]:
    """(typestr, itemsize, bytes, C-contiguous) of a __cuda_array_interface__ dict."""
    typestr, itemsize, _ = dtypes.resolve(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    n = math.prod(shape)
    contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize) or n <= 1
    return typestr, itemsize, n * itemsize, contiguous


def learn_foreign(value: Any, typestr: str) -> None:
    """Tell the C packer that arrays of this type and dtype read as `typestr`; the next
    launch with one is packed in C, after the same checks this path made."""
    cls, dtype = type(value), getattr(value, "dtype", None)
    if dtype is None:   # nothing to tell its arrays apart by: they stay on this path
        return
    try:
        if (cls, dtype) in _learned:
            return
    except TypeError:   # an unhashable dtype: stay on this path
        return
    from .stream import FRAMEWORKS, TORCH
    kind = FRAMEWORKS.get(cls.__module__.partition(".")[0])
    register = libcuda.c_function("register_foreign") if kind else None
    if kind == TORCH and value.is_complex():   # a conjugate view is told apart in Python only
        register = None
    if register is not None:
        code = -1
        torch = sys.modules.get("torch")
        if kind == TORCH and cls in (torch.Tensor, torch.nn.Parameter):   # subclasses keep
            from . import torch_shim                                      # __torch_function__
            code = torch_shim.dtype_code(value)
        if code >= 0:
            register(cls, kind, dtype, typestr, code, value.element_size())
        else:
            register(cls, kind, dtype, typestr)
        if kind not in _frameworks_registered:
            _register_framework(kind)
            _frameworks_registered.add(kind)
    _learned.add((cls, dtype))


def _register_framework(kind: int) -> None:
    """What the C packer reads of a framework, handed over once: how to read its current
    stream and, for CuPy, where its arrays hold their fields."""
    from . import cupy_capi
    from .stream import CUPY, c_stream_reader
    c_stream_reader(kind)
    layout = cupy_capi.array_layout() if kind == CUPY else None
    if layout is not None:
        libcuda.c_function("register_cupy_layout")(*layout)


# DLPack device types (dlpack.h)
_DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 2, 3, 13


def foreign_device(value: Any, address: int, stream: Any = None) -> int | None:
    """The device of a foreign array's memory (None: any device may use it, or unknown). An
    array that declares its DLPack device (PyTorch, CuPy) is taken at its word, with no
    driver call; for the rest (the CUDA array interface names no device) the driver says
    whose memory the address is, except while the launch's stream is being captured, when
    kjit asks the driver nothing it might refuse (a refused call would end the capture)."""
    declared = getattr(value, "__dlpack_device__", None)
    if declared is not None:
        try:
            dev_type, dev_id = declared()
            dev_type = int(dev_type)
        except Exception:   # a __dlpack_device__ that cannot answer: ask the driver
            pass
        else:
            if dev_type == _DL_CUDA:
                return int(dev_id)
            if dev_type in (_DL_CUDA_HOST, _DL_CUDA_MANAGED):
                return None
    if stream is not None:
        from .stream import capture_state
        if capture_state(stream) is not None:
            return None
    return libcuda.pointer_device(address)


def check_capturable(slot: ParamSlot, value: _HostTransfer, stream: Any) -> None:
    """In/Out allocate, copy and wait around the launch: nothing a graph capture can record
    (the driver would fail the call and invalidate the whole capture), so refuse first."""
    if stream is None:
        return
    from .stream import capture_state
    why = capture_state(stream)
    if why:
        raise ArgumentError(
            f"{slot.describe()}: kjit.{type(value).__name__} copies a host array around the "
            f"launch and waits for it, which a graph capture cannot record ({why}). Copy the "
            "data into a device array before the capture (kjit.to_device, torch, CuPy) and "
            "pass that")


def address_of(value: Any) -> int | None:
    """The address a pointer-like value stands for (kjit.ptr, kjit array, PyTorch tensor,
    CUDA array interface), None for anything else."""
    if isinstance(value, ptr):
        return value.value
    if isinstance(value, DeviceArray):
        return value.ptr
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):   # one on the GPU, with memory
        try:
            return value.data_ptr() if value.device.type == "cuda" else None
        except RuntimeError:
            return None
    cai = array_interface(value)
    return int(cai["data"][0] or 0) if cai is not None else None


def check_array(slot: ParamSlot, typestr: str, contiguous: bool, arr_device: int | None,
                device: int) -> None:
    want = slot.ctype.typestr if slot.ctype.kind == "pointer" else None  # word64: pointee unknown
    if want is not None and not dtypes.accepts(want, typestr):
        how = (f"pass a torch.{want} tensor, or its bits as {dtypes.name(dtypes.BITS[want])}"
               if want in dtypes.BITS else f"convert it (e.g. x.astype(np.{dtypes.name(want)}))")
        raise ArgumentError(
            f"{slot.describe()}: the array holds {dtypes.name(typestr)} but the kernel reads "
            f"{dtypes.name(want)}; {how}")
    if not contiguous:
        raise ArgumentError(
            f"{slot.describe()}: the array is not C-contiguous (a strided view); the kernel "
            "would read it as dense memory. Pass a contiguous copy, or kjit.ptr(address) if "
            "the kernel handles the strides itself")
    if arr_device is not None and arr_device != device:
        raise ArgumentError(
            f"{slot.describe()}: the array is on device {arr_device} but this launch runs on "
            f"device {device} (where its other arguments or its stream are). Copy the array to "
            f"device {device}; to read it in place, enable peer access "
            f"(kjit.Device({device}).enable_peer_access({arr_device})) "
            "and pass kjit.ptr(address)")



def array_device(value: Any) -> int | None:
    """The device whose memory an argument is: kjit arrays, PyTorch tensors, CuPy arrays and
    anything with `__cuda_array_interface__` or `__dlpack__`; None for the rest (scalars,
    kjit.ptr, kjit.In/Out, host and managed memory), which any device may take."""
    if isinstance(value, DeviceArray):
        return value.device
    if isinstance(value, (ptr, _HostTransfer)) or is_numpy(value, "ndarray"):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        where = value.device
        return where.index if where.type == "cuda" else None
    try:
        cai = array_interface(value)
        if cai is not None:
            return foreign_device(value, int(cai["data"][0] or 0))
        if hasattr(value, "__dlpack_device__"):
            return foreign_device(value, 0)
    except Exception:   # the launch's own checks say what is wrong with such an argument
        return None
    return None


def arguments_device(kernel: str, slots: tuple, args: tuple) -> int | None:
    """The one device the launch's arrays live on (None: no array names one), or an
    ArgumentError naming the parameters on each device when they are on several."""
    where: dict[int, list[str]] = {}
    for slot, value in zip(slots, args):
        device = array_device(value)
        if device is not None:
            where.setdefault(device, []).append(f"'{slot.name}'")
    if len(where) > 1:
        each = "; ".join(f"{', '.join(names)} on device {d}" for d, names in sorted(where.items()))
        a, b = sorted(where)[:2]
        raise ArgumentError(
            f"kernel {kernel!r}: its arrays are on {len(where)} devices ({each}). A launch runs "
            f"on one device: copy them to one (x.to('cuda:{b}') for a tensor, x.to({b}) for a "
            f"kjit array), or, for a kernel on device {b} to read device {a}'s memory in place, "
            f"enable peer access (kjit.Device({b}).enable_peer_access({a})) and pass that array "
            "as kjit.ptr(address)")
    return next(iter(where), None)


def detach_grads(args: tuple) -> tuple:
    """The arguments with every tensor that requires grad detached: a PyTorch operator's
    implementation runs below autograd, which records the operator itself."""
    torch = sys.modules.get("torch")
    if torch is None:
        return args
    return tuple(a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)
