"""`kjit info`: versions, devices and supported architectures."""
from __future__ import annotations

import click

from .common import emit, json_option


def gather() -> dict:
    from .. import __version__, arch, driver
    from ..compiler import nvrtc
    info: dict = {"kjit": __version__}
    try:
        from importlib.metadata import version
        info["cuda_bindings"] = version("cuda-bindings")
    except Exception:
        info["cuda_bindings"] = None
    try:
        info["nvrtc"] = ".".join(map(str, nvrtc.version()))
        info["nvrtc_archs"] = [f"sm_{n}" for n in arch.nvrtc_supported()]
    except Exception as exc:
        info["nvrtc"], info["nvrtc_archs"] = None, []
        info["nvrtc_error"] = str(exc)
    try:
        from cuda.bindings import nvjitlink
        v = nvjitlink.version()
        info["nvjitlink"] = ".".join(map(str, v))
    except Exception:
        info["nvjitlink"] = None
    try:
        from cuda.bindings import nvfatbin
        info["nvfatbin"] = ".".join(map(str, nvfatbin.version()))
    except Exception:
        info["nvfatbin"] = None
    info["driver"] = None
    info["devices"] = []
    try:
        driver.init()
        v = driver.driver_version()
        info["driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        drv = driver.bindings()
        for i in range(driver.device_count()):
            dev = driver.call(drv.cuDeviceGet, i)
            name = driver.call(drv.cuDeviceGetName, 256, dev).split(b"\0")[0].decode()
            major, minor = driver.compute_capability(i)
            mem = driver.call(drv.cuDeviceTotalMem, dev)
            info["devices"].append({"index": i, "name": name, "arch": f"sm_{major}{minor}",
                                    "memory_bytes": int(mem)})
    except Exception as exc:
        info["driver_error"] = str(exc).splitlines()[0]
    try:
        from ..cache.store import cache_dir
        info["cache_dir"] = str(cache_dir())
    except Exception:
        info["cache_dir"] = None
    try:
        from ..compiler import hiprtc
        info["hiprtc"] = ".".join(map(str, hiprtc.version()))
    except Exception:
        info["hiprtc"] = None
    return info


def _text(d: dict) -> str:
    lines = [f"kjit            {d['kjit']}",
             f"cuda-bindings   {d['cuda_bindings']}",
             f"NVRTC           {d['nvrtc']}",
             f"nvJitLink       {d['nvjitlink']}",
             f"nvFatbin        {d['nvfatbin']}",
             f"hiprtc          {d['hiprtc'] or 'not installed'}",
             f"driver          {d['driver'] or 'none (' + d.get('driver_error', '') + ')'}"]
    for dev in d["devices"]:
        lines.append(f"device {dev['index']}        {dev['name']} ({dev['arch']}, "
                     f"{dev['memory_bytes'] / 2**30:.0f} GiB)")
    lines.append(f"NVRTC archs     {', '.join(d['nvrtc_archs'])}")
    lines.append(f"cache           {d['cache_dir']}")
    return "\n".join(lines)


@click.command("info")
@json_option
def info_cmd(as_json: bool) -> None:
    """Versions of kjit and its compilers, the driver and devices, and the cache location."""
    emit(gather(), as_json, _text)
