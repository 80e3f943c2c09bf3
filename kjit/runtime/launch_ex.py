"""Launches through cuLaunchKernelEx: cooperative launches and thread-block clusters, with
the same argument packing and stream rules as `k[grid, block](...)`."""
from __future__ import annotations

from typing import Any

from .. import driver
from ..errors import ArgumentError
from . import context as context_mod
from .stream import as_handle, check_stream_context, framework_stream


def _dim3(value: Any, what: str) -> tuple[int, int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        dims = (value, 1, 1)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3:
        dims = tuple(value) + (1,) * (3 - len(value))
    else:
        raise ArgumentError(f"{what} must be an int or a tuple of 1-3 ints, got {value!r}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < 2**32:
            raise ArgumentError(f"{what} dimensions must be ints in 1..2**32-1, got {value!r}")
    return dims  # type: ignore[return-value]


def launch_ex(kernel: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int, stream: Any,
              cooperative: bool, cluster: Any) -> None:
    """Launch `kernel` (a Kernel of the current context) with launch attributes."""
    stream = as_handle(framework_stream(args, kernel.device, kernel.name) if stream is None
                       else stream)
    check_stream_context(stream, kernel._ctx, kernel.device, kernel.name)
    drv = driver.bindings()
    kernel._check_shared(shared_mem)
    dev = driver.call(drv.cuDeviceGet, kernel.device)
    attrs = []
    if cooperative:
        if not driver.call(drv.cuDeviceGetAttribute,
                           drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev):
            raise ArgumentError(f"device {kernel.device} does not support cooperative launch")
        per_sm = kernel.max_active_blocks(block[0] * block[1] * block[2], shared_mem)
        sms = driver.call(drv.cuDeviceGetAttribute,
                          drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
        if grid[0] * grid[1] * grid[2] > per_sm * sms:
            raise ArgumentError(
                f"cooperative launch of {grid[0] * grid[1] * grid[2]} blocks exceeds the "
                f"{per_sm * sms} that can be resident at once on device {kernel.device}")
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        a.value.cooperative = 1
        attrs.append(a)
    if cluster is not None:
        cdims = _dim3(cluster, "cluster")
        if not driver.call(drv.cuDeviceGetAttribute,
                           drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, dev):
            raise ArgumentError(f"device {kernel.device} does not support thread-block clusters")
        if any(g % c for g, c in zip(grid, cdims)):
            raise ArgumentError(f"grid {grid} is not a multiple of the cluster shape {cdims}")
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cdims
        attrs.append(a)
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = shared_mem
    cfg.hStream = stream
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)
    buf, ptrs, addr, pending = kernel._pack_slow(args, stream)
    context_mod.last_launch[0] = kernel.name
    (err,) = drv.cuLaunchKernelEx(cfg, kernel.handle, addr, 0)
    if err:
        kernel._launch_failed(err, *grid, *block, shared_mem, stream, addr, pending)
    kernel._finish(pending, stream)
