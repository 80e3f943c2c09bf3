"""AMD's code-object manager (libamd_comgr) through ctypes: the targets the installed
compiler knows, and the kernel-argument metadata inside an AMD code object.

hiprtc compiles through comgr, so comgr's list of targets is exactly what hiprtc accepts.
The metadata is HIP's answer to cuFuncGetParamInfo, and needs no GPU: every kernel's
explicit arguments with their offset and size in the kernarg segment.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

from ..errors import InvalidOptionError
from . import loader

ISA_PREFIX = "amdgcn-amd-amdhsa--"
_DATA_KIND_EXECUTABLE = 8


class _Handle(ctypes.Structure):
    _fields_ = [("handle", ctypes.c_uint64)]


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL | None:
    """libamd_comgr with the signatures kjit uses, or None where it is not installed."""
    lib = loader.load_first(loader.COMGR_NAMES, "amd_comgr_get_isa_metadata")
    if lib is None:
        return None
    h, hp, sz = _Handle, ctypes.POINTER(_Handle), ctypes.c_size_t
    for name, argtypes in {
        "amd_comgr_get_isa_count": [ctypes.POINTER(sz)],
        "amd_comgr_get_isa_name": [sz, ctypes.POINTER(ctypes.c_char_p)],
        "amd_comgr_get_isa_metadata": [ctypes.c_char_p, hp],
        "amd_comgr_create_data": [ctypes.c_int, hp],
        "amd_comgr_set_data": [h, sz, ctypes.c_char_p],
        "amd_comgr_release_data": [h],
        "amd_comgr_get_data_metadata": [h, hp],
        "amd_comgr_destroy_metadata": [h],
        "amd_comgr_metadata_lookup": [h, ctypes.c_char_p, hp],
        "amd_comgr_get_metadata_kind": [h, ctypes.POINTER(ctypes.c_int)],
        "amd_comgr_get_metadata_list_size": [h, ctypes.POINTER(sz)],
        "amd_comgr_index_list_metadata": [h, sz, hp],
        "amd_comgr_get_metadata_string": [h, ctypes.POINTER(sz), ctypes.c_char_p],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    lib.amd_comgr_get_version.argtypes = [ctypes.POINTER(sz)] * 2
    lib.amd_comgr_get_version.restype = None
    return lib


def version() -> tuple[int, int] | None:
    lib = library()
    if lib is None:
        return None
    major, minor = ctypes.c_size_t(), ctypes.c_size_t()
    lib.amd_comgr_get_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


@functools.lru_cache(maxsize=None)
def isa_names() -> tuple[str, ...]:
    """The gfx processors comgr can compile for, e.g. ('gfx600', ..., 'gfx90a', ...); () if unknown."""
    lib = library()
    count = ctypes.c_size_t()
    if lib is None or lib.amd_comgr_get_isa_count(ctypes.byref(count)) != 0:
        return ()
    names = []
    for i in range(count.value):
        name = ctypes.c_char_p()
        if lib.amd_comgr_get_isa_name(i, ctypes.byref(name)) == 0 and name.value:
            names.append(name.value.decode().removeprefix(ISA_PREFIX))
    return tuple(names)


def is_valid_target(target: str) -> bool | None:
    """Whether comgr accepts the target ID (gfx90a, gfx90a:xnack-); None without comgr."""
    lib = library()
    if lib is None:
        return None
    node = _Handle()
    if lib.amd_comgr_get_isa_metadata((ISA_PREFIX + target).encode(), ctypes.byref(node)) != 0:
        return False
    lib.amd_comgr_destroy_metadata(node)
    return True


# --- code-object metadata -------------------------------------------------------------------
@dataclass(frozen=True)
class KernelArgs:
    """A kernel's explicit arguments as the code object lays them out."""

    name: str                          # the kernel's symbol (lowered name for C++ kernels)
    args: tuple[tuple[int, int], ...]  # (offset, size) per explicit argument, in order
    kinds: tuple[str, ...]             # "by_value", "global_buffer", ...
    kernarg_size: int                  # whole segment, hidden arguments included


class _Walker:
    """Reads a metadata tree; destroys every node it obtained when closed (comgr's rule)."""

    def __init__(self, lib):
        self.lib = lib
        self.nodes: list[_Handle] = []

    def string(self, node: _Handle | None) -> str:
        if node is None:
            return ""
        size = ctypes.c_size_t()
        self.lib.amd_comgr_get_metadata_string(node, ctypes.byref(size), None)
        buf = ctypes.create_string_buffer(size.value)
        self.lib.amd_comgr_get_metadata_string(node, ctypes.byref(size), buf)
        return buf.value.decode()

    def get(self, node: _Handle, key: str) -> _Handle | None:
        value = _Handle()
        if self.lib.amd_comgr_metadata_lookup(node, key.encode(), ctypes.byref(value)) != 0:
            return None
        self.nodes.append(value)
        return value

    def items(self, node: _Handle | None) -> list[_Handle]:
        if node is None:
            return []
        size = ctypes.c_size_t()
        self.lib.amd_comgr_get_metadata_list_size(node, ctypes.byref(size))
        out = []
        for i in range(size.value):
            item = _Handle()
            if self.lib.amd_comgr_index_list_metadata(node, i, ctypes.byref(item)) == 0:
                self.nodes.append(item)
                out.append(item)
        return out

    def close(self) -> None:
        for node in reversed(self.nodes):
            self.lib.amd_comgr_destroy_metadata(node)
        self.nodes.clear()


def kernel_args(code: bytes) -> dict[str, KernelArgs]:
    """Every kernel's explicit arguments (offset, size) from an AMD code object's metadata.

    Hidden arguments (hidden_*: grid offsets, printf buffer...) are left out: the runtime
    fills those. InvalidOptionError if comgr is missing or the bytes are no code object.
    """
    lib = library()
    if lib is None:
        raise InvalidOptionError(
            f"reading AMD kernel metadata needs libamd_comgr; install it: {loader.INSTALL_HINT}")
    data = _Handle()
    if lib.amd_comgr_create_data(_DATA_KIND_EXECUTABLE, ctypes.byref(data)) != 0:
        raise InvalidOptionError("amd_comgr_create_data failed")
    walker = _Walker(lib)
    try:
        root = _Handle()
        if lib.amd_comgr_set_data(data, len(code), bytes(code)) != 0 or \
                lib.amd_comgr_get_data_metadata(data, ctypes.byref(root)) != 0:
            raise InvalidOptionError("not an AMD code object with kernel metadata")
        walker.nodes.append(root)
        out: dict[str, KernelArgs] = {}
        for k in walker.items(walker.get(root, "amdhsa.kernels")):
            args, kinds = [], []
            for a in walker.items(walker.get(k, ".args")):
                kind = walker.string(walker.get(a, ".value_kind"))
                if kind.startswith("hidden_"):
                    continue
                args.append((int(walker.string(walker.get(a, ".offset"))),
                             int(walker.string(walker.get(a, ".size")))))
                kinds.append(kind)
            name = walker.string(walker.get(k, ".name"))
            size = walker.string(walker.get(k, ".kernarg_segment_size"))
            out[name] = KernelArgs(name, tuple(args), tuple(kinds), int(size or 0))
        return out
    finally:
        walker.close()
        lib.amd_comgr_release_data(data)
