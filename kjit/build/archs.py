"""Which architectures a build targets: --arch and --ptx values resolved and validated."""
from __future__ import annotations

from typing import Any, Sequence

from .. import arch as arch_mod
from .. import compiler   # its face: read at each call
from ..errors import InvalidOptionError

def resolve_archs(values: Sequence[str], backend: str = "cuda") -> list[str]:
    """The architectures named by --arch values (comma lists, `all`, `native`, families),
    validated against the installed compiler, sorted and without duplicates."""
    names = [v.strip() for value in values for v in value.split(",") if v.strip()]
    if not names:
        return [arch_mod.resolve(None, backend).name]
    out: list[Any] = []
    for name in names:
        low = name.lower()
        if low == "all":
            if backend == "hip":
                raise InvalidOptionError("--arch all is for CUDA; name the gfx targets for HIP, "
                                         "e.g. --arch gfx90a,gfx942")
            out += [arch_mod.parse(f"sm_{n}") for n in compiler.nvrtc_supported()]
        elif low == "native":
            out += _native_archs(backend)
        else:
            a = arch_mod.parse(name, backend)
            compiler.check_supported(a)
            out.append(a)
    unique = {a.name: a for a in out}
    return [a.name for a in sorted(unique.values(), key=lambda a: (a.number, a.suffix, a.name))]


def _native_archs(backend: str) -> list[Any]:
    from .. import driver
    if backend == "hip":
        raise InvalidOptionError("--arch native is for CUDA devices; name the gfx targets for "
                                 "HIP, e.g. --arch gfx90a")
    reason = ""
    try:
        driver.init()
        count = driver.device_count()
    except Exception as exc:  # no driver library, no device: all mean "no GPU here"
        count, reason = 0, (str(exc).splitlines() or [type(exc).__name__])[0]
    if not count:
        raise InvalidOptionError(
            "--arch native needs a CUDA driver and GPU, and this machine has none"
            + (f" ({reason})" if reason else "")
            + ": name the architectures instead, e.g. --arch sm_80,sm_90,sm_100, or --arch all")
    found = [arch_mod.parse(f"sm_{ma}{mi}") for ma, mi in
             (driver.compute_capability(i) for i in range(count))]
    for a in found:
        compiler.check_supported(a)
    return found


def resolve_ptx(archs: Sequence[str], ptx_values: Sequence[str], no_ptx: bool) -> list[str]:
    """The virtual architectures to embed PTX for: --ptx values, else compute_<newest real
    arch> (plain, so any later GPU can JIT it), none with --no-ptx."""
    names = [v.strip() for value in ptx_values for v in value.split(",") if v.strip()]
    if no_ptx:
        if names:
            raise InvalidOptionError("--ptx and --no-ptx contradict each other: choose one")
        return []
    if not names:
        real = [arch_mod.parse(a) for a in archs if not arch_mod.parse(a).virtual]
        if not real:
            return []
        newest = max(real, key=lambda a: a.number)
        names = [f"compute_{newest.number}"]
    out = {}
    for name in names:
        a = arch_mod.parse(name)
        compiler.check_supported(a)
        out[a.compute] = a
    return [n for n, _ in sorted(out.items(), key=lambda kv: (kv[1].number, kv[1].suffix))]

