"""`kjit info`: versions, devices and supported architectures."""
from __future__ import annotations

import click

from .common import emit, json_option


def gather() -> dict:
    from .. import __version__, driver
    from ..compiler import nvrtc_supported, nvrtc_version
    info: dict = {"kjit": __version__}
    try:
        from importlib.metadata import version
        info["cuda_bindings"] = version("cuda-bindings")
    except Exception:
        info["cuda_bindings"] = None
    try:
        info["nvrtc"] = ".".join(map(str, nvrtc_version()))
        info["nvrtc_archs"] = [f"sm_{n}" for n in nvrtc_supported()]
    except Exception as exc:
        info["nvrtc"], info["nvrtc_archs"] = None, []
        info["nvrtc_error"] = str(exc)
    from ..families import load_family_library
    try:
        load_family_library("nvjitlink")   # the one kjit links with, as for a link
        from cuda.bindings import nvjitlink
        v = nvjitlink.version()
        info["nvjitlink"] = ".".join(map(str, v))
    except Exception:
        info["nvjitlink"] = None
    try:
        load_family_library("nvfatbin")
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
        from ..locations import cache_dir
        info["cache_dir"] = str(cache_dir())
    except Exception:
        info["cache_dir"] = None
    from ..cache import describe_remote
    info["remote_cache"] = describe_remote()
    try:
        from ..compiler import hiprtc_version
        info["hiprtc"] = ".".join(map(str, hiprtc_version()))
    except Exception:
        info["hiprtc"] = None
    info["headers"] = _headers(info["hiprtc"])
    from ..compiler import describe_observer
    info["header_keys"] = describe_observer()
    return info


def _headers(hiprtc_version: str | None) -> dict:
    """The directories searched after the user's, and the wheels that provide them."""
    from ..compiler import describe_headers
    try:
        out = describe_headers()
    except Exception as exc:  # a broken cuda-pathfinder must not break `kjit info`
        out = {"dirs": [], "error": str(exc)}
    if hiprtc_version:
        from ..compiler import hip_builtin_headers
        out["hip_builtin_names"] = list(hip_builtin_headers(int(hiprtc_version.split(".")[0])))
    return out


def _remote_text(r: dict | None) -> str:
    if r is None:
        return "none (set KJIT_REMOTE_CACHE=redis://host:port/db to share compiles across nodes)"
    if "url" not in r:
        return f"misconfigured: {r['error']}"
    if r.get("off"):
        return f"{r['url']}: OFF. {r['error']}"
    signed = ("signed (HMAC-SHA256)" if r["signed"] else
              "UNSIGNED (KJIT_REMOTE_CACHE_UNSIGNED=1): any client that can write to it can make "
              "this node run its code; set KJIT_REMOTE_CACHE_KEY_FILE to sign")
    from ..cache import REDIS_BACKEND
    redis = r.get("backend") == REDIS_BACKEND
    state = (f"Redis {r['server']}" if redis else r["server"]) if r.get("reachable") else \
        f"unreachable: {r.get('error')}"
    return f"{r['url']} ({state}); {signed}"


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
    lines += _header_lines(d.get("headers") or {})
    keys = d.get("header_keys") or {}
    lines.append("header keys     " + (
        "observed (the files the compiler opened and the paths it found absent)"
        if keys.get("mode") == "observed" else
        f"not observed ({keys.get('reason')}): compiles that may read a header are not "
        "cached"))
    lines.append(f"cache           {d['cache_dir']}")
    lines.append(f"remote cache    {_remote_text(d.get('remote_cache'))}")
    return "\n".join(lines)


def _header_lines(h: dict) -> list[str]:
    lines = []
    for i, item in enumerate(h.get("dirs", [])):
        label = "CCCL" if item["name"] == "cccl" else "CUDA runtime headers"
        if item.get("cccl_version"):
            label += f" {item['cccl_version']}"
        if item.get("package"):
            label += f", {item['package']} {item['version']}"
        for dist, version in (item.get("also") or {}).items():
            label += f", {dist} {version}"
        where = item["dir"] or "not found (install the wheel named in pyproject's dependencies)"
        lines.append(f"{'headers' if i == 0 else '':16s}{where} ({label})")
    if h.get("error"):
        lines.append(f"headers         unavailable: {h['error']}")
    if h.get("dirs"):
        lines.append(f"{'':16s}tested together: {h.get('tested')}")
    return lines


@click.command("info")
@json_option
def info_cmd(as_json: bool) -> None:
    """Versions of kjit and its compilers, the driver and devices, and the cache location."""
    emit(gather(), as_json, _text)
