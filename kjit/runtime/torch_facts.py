"""A tensor read in one C call: `torch_facts.cpp`, at::TensorBase's inline accessors compiled
against the PyTorch in use, answers everything the C packer asks of a `torch.Tensor` (device,
layout, nesting, dtype, contiguity, element count, address, storage, `requires_grad`), where
PyTorch's C shim (torch_shim.py) takes nine calls and two Python getters for the same.

Built with the system's C++ compiler (`$CXX`, else `c++` or `g++`) against the headers the
PyTorch wheel ships, in the background the first time a process reads a tensor (about 2 s; the
shim serves until then), and kept in the cache directory's `native/` under a key naming the
PyTorch build, so later processes load it at once. It is used only after it answers as PyTorch
and the shim do for a set of tensors; without a compiler, with `KJIT_TORCH_READER=0`, or when
anything differs, the shim stays. A kept file is loaded only where the cache directory is
trusted (kjit.cache.trust), from a private copy made after checking it."""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable

from .. import settings
from ..hashing import sha256
from ..locations import cache_dir
from . import libcuda

SOURCE = Path(__file__).with_name("torch_facts.cpp")
SYMBOL = "kjit_torch_facts"
MAX_BYTES = 16 << 20        # a kept reader is about 20 KB
BUILD_SECONDS = 300


class Facts(ctypes.Structure):
    """torch_facts.cpp's KjitTensorFacts (and _foreign.c's TensorFacts)."""
    _fields_ = ([(n, ctypes.c_int32) for n in ("device_type", "device_index", "layout", "dtype", "nested",
                                                "contiguous", "requires_grad", "has_storage")]
                + [(n, ctypes.c_int64) for n in ("numel", "storage_nbytes", "storage_offset")]
                + [("data", ctypes.c_void_p)])


_lock = threading.Lock()
_state: dict[str, Any] = {}   # "fn": the checked reader; "thread": its build; "why": why none


def installed() -> bool:
    """Whether the C packer reads tensors through the reader."""
    return "fn" in _state


def address() -> int:
    """The reader's address, as the C packer holds it (0: none)."""
    fn = _state.get("fn")
    return (ctypes.cast(fn, ctypes.c_void_p).value or 0) if fn is not None else 0


def wait(timeout: float = BUILD_SECONDS) -> bool:
    """Wait for a build under way; whether the reader is in use."""
    thread = _state.get("thread")
    if thread is not None:
        thread.join(timeout)
    return installed()


def why_not() -> str | None:
    """Why the reader is not in use (None: it is, or has not been tried)."""
    return _state.get("why")


def install(t: Any, shim_ask: Callable[[str, Any], Any]) -> None:
    """Start using the reader, checked with host tensors of each kind the packer tells apart
    and with `t` (a CUDA tensor the shim read; after a build, if it is still alive): at once
    when a kept one exists, else after a build in the background. `shim_ask(name, tensor)` is
    the shim's answer, which the reader's must equal."""
    with _lock:
        if "tried" in _state:
            return
        _state["tried"] = True
    if not settings.switch_on(settings.ENV_TORCH_READER):
        _state["why"] = f"{settings.ENV_TORCH_READER}=0"
        return
    torch = sys.modules["torch"]
    kept = _kept_path(torch)
    if kept is not None and kept.exists():
        _use(kept, t, shim_ask)
        return
    # the build checks the reader with `t` too if it is still alive then (held weakly: a
    # program's tensor is not kept for the build's sake)
    thread = threading.Thread(target=_build_and_use, args=(torch, kept, weakref.ref(t), shim_ask),
                              name="kjit-torch-reader", daemon=True)
    _state["thread"] = thread
    thread.start()


def _torch_dirs(torch: Any) -> tuple[Path, Path]:
    root = Path(torch.__file__).parent
    return root / "include", root / "lib"


def _key(torch: Any) -> str:
    """What the built reader depends on: its source, and the PyTorch build it was compiled
    against (version, commit, C++ ABI, its libraries as installed)."""
    _, lib = _torch_dirs(torch)
    parts = [SOURCE.read_bytes().hex(), torch.__version__, str(getattr(torch.version, "git_version", "")),
             str(int(torch._C._GLIBCXX_USE_CXX11_ABI)), sys.platform]
    for name in ("libc10.so", "libtorch_cpu.so"):
        with contextlib.suppress(OSError):
            st = (lib / name).stat()
            parts.append(f"{lib / name}:{st.st_size}:{st.st_mtime_ns}")
    return sha256("\0".join(parts).encode()).hexdigest()[:32]


def _kept_path(torch: Any) -> Path | None:
    """Where the reader for this PyTorch is kept; None where nothing may be kept or read."""
    if not settings.cache_enabled():
        return None
    from ..cache import trusted
    try:
        d = cache_dir()
        return d / "native" / f"torch-facts-{_key(torch)}.so" if trusted(d) else None
    except Exception:   # no home directory to keep it in
        return None


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _build(torch: Any, out: Path) -> bool:
    """Compile the reader to `out` (replaced whole); False, with the reason kept, on failure."""
    cxx = _compiler()
    if cxx is None:
        _state["why"] = "no C++ compiler ($CXX, c++ or g++)"
        return False
    include, lib = _torch_dirs(torch)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        for std in ("c++20", "c++17"):   # what this PyTorch's headers need
            cmd = [cxx, "-O2", "-shared", "-fPIC", f"-std={std}", "-fvisibility=hidden",
                   f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-I{include}",
                   str(SOURCE), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_SECONDS)
            if done.returncode == 0:
                os.replace(tmp, out)
                return True
        _state["why"] = f"{cxx} failed: {done.stderr.strip()[-400:]}"
        return False
    except (OSError, subprocess.SubprocessError) as exc:
        _state["why"] = f"building it failed: {exc}"
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _build_and_use(torch: Any, kept: Path | None, tensor: Callable[[], Any],
                   shim_ask: Callable[[str, Any], Any]) -> None:
    try:
        # kept only in a cache directory kjit's cache made (with its permissions): `native/`
        # is made private beside its other folders
        if kept is not None and kept.parent.parent.is_dir():
            with contextlib.suppress(OSError):
                kept.parent.mkdir(mode=0o700, exist_ok=True)
            if kept.parent.is_dir() and _build(torch, kept):
                _use(kept, tensor(), shim_ask)
                return
        with tempfile.TemporaryDirectory(prefix="kjit-torch-reader-") as d:   # this process only
            out = Path(d) / "torch-facts.so"
            if _build(torch, out):
                _use(out, tensor(), shim_ask)
    except Exception as exc:   # the shim stays
        _state["why"] = f"{type(exc).__name__}: {exc}"


def _load(path: Path) -> Any:
    """The reader in the file kjit wrote: its bytes read only if kjit's cache rules trust the
    file, then loaded from a private copy, so nothing swapped in after the check is run."""
    from ..cache import read_private
    data = read_private(path, MAX_BYTES)
    if len(data) > MAX_BYTES:
        raise OSError(f"{path} is larger than a reader can be")
    try:   # beside it (a temporary directory may be mounted noexec), else in one
        fd, copy = tempfile.mkstemp(suffix=".so", prefix=".load-", dir=path.parent)
    except OSError:
        fd, copy = tempfile.mkstemp(suffix=".so", prefix="kjit-torch-reader-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        lib = ctypes.CDLL(copy)
    finally:
        os.unlink(copy)
    fn = getattr(lib, SYMBOL)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(Facts)]
    return fn


def _use(path: Path, t: Any, shim_ask: Callable[[str, Any], Any]) -> None:
    try:
        fn = _load(path)
        if not _agrees(fn, t, shim_ask):
            _state["why"] = "its answers differ from PyTorch's"
            return
        register = libcuda.c_function("register_torch_facts")
        if register is None:
            _state["why"] = "the C extension is not built"
            return
        register(ctypes.cast(fn, ctypes.c_void_p).value)
        _state["fn"] = fn
        _state.pop("why", None)
    except Exception as exc:   # an unreadable or refused file, a reader that will not load
        _state["why"] = f"{type(exc).__name__}: {exc}"


def facts(t: Any) -> Facts | None:
    """What the reader in use answers for tensor `t` (None: no reader, or PyTorch raised)."""
    fn = _state.get("fn")
    return read(fn, t) if fn is not None else None


def read(fn: Any, t: Any) -> Facts | None:
    """Reader `fn`'s answer for tensor `t`, None where PyTorch raised."""
    word = ctypes.c_void_p(t._cdata)   # an at::Tensor is this one TensorImpl pointer
    f = Facts()
    return f if fn(ctypes.byref(word), ctypes.byref(f)) == 0 else None


def _agrees(fn: Any, t: Any, shim_ask: Callable[[str, Any], Any]) -> bool:
    """Whether the reader answers as PyTorch's Python API and its shim do: host tensors of
    each kind the packer tells apart, and `t` (a CUDA tensor) where given."""
    torch = sys.modules["torch"]
    # on the host, named: a default device or dtype must not change them, and a graph capture
    # may be running on the device
    host = torch.empty((3, 4), device="cpu", dtype=torch.float32)
    view, grad = host[1:], torch.ones(2, device="cpu", dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():   # nested tensors are a prototype and say so
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], device="cpu")
    sparse = torch.ones(3, device="cpu").to_sparse()
    got = {name: read(fn, x) for name, x in
           (("host", host), ("t", host.t()), ("view", view), ("grad", grad), ("nested", nested),
            ("sparse", sparse))}
    if any(f is None for f in got.values()):
        return False
    h, v, g = got["host"], got["view"], got["grad"]
    same = (
        h.device_type == shim_ask("get_device_type", host) and h.layout == shim_ask("get_layout", host)
        and h.dtype == shim_ask("get_dtype", host) and g.dtype == shim_ask("get_dtype", grad) != h.dtype
        and h.contiguous == 1 and got["t"].contiguous == 0 and not h.nested and got["nested"].nested == 1
        and got["sparse"].layout != h.layout and h.requires_grad == 0 and g.requires_grad == 1
        and v.numel == view.numel() == 8 and v.storage_offset == view.storage_offset() == 4
        and v.storage_nbytes == host.untyped_storage().nbytes() and v.has_storage == 1
        and (v.data or 0) == view.data_ptr() and (h.data or 0) == host.data_ptr())
    if same and t is not None:
        f = read(fn, t)
        same = (f is not None and (f.data or 0) == t.data_ptr() and f.device_index == t.get_device()
                and f.device_type == shim_ask("get_device_type", t) != h.device_type
                and f.dtype == shim_ask("get_dtype", t) and f.contiguous == int(t.is_contiguous()))
    return bool(same)
