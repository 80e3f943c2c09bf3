"""The CUDA device runtime (libcudadevrt.a): when relocatable code needs it, and where it is.

Device-side kernel launch (`child<<<...>>>` in a kernel) and the device-side cuda* API
compile to calls into libcudadevrt, which must be linked in. kjit finds the archive in the
installed NVIDIA wheels (nvidia-cuda-runtime puts it in site-packages/nvidia/cu13/lib).
"""
from __future__ import annotations

import glob
import os
import re
import site
import sys
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import LinkError
from ..settings import env_text

ENV_DEVRT = "KJIT_CUDADEVRT"

# Functions libcudadevrt defines: the CDP2 launch entry points, the legacy names, and the
# device-side runtime API (cudaMalloc, cudaStreamCreateWithFlags, cudaGetDevice...).
_DEVRT_NAME = rb"(?:__cudaCDP\w+|cuda[A-Z]\w*)"
_PTX_EXTERN_RE = re.compile(rb"\.extern\s+\.func\s+(?:\([^)]*\)\s*)?(" + _DEVRT_NAME + rb")")
_DEVRT_NAME_RE = re.compile(_DEVRT_NAME.decode() + "$")
_PTX_DEFINED_RE = re.compile(rb"\.(?:visible|weak)\s+\.(?:func|entry)\s+(?:\([^)]*\)\s*)?([\w$]+)")


def is_devrt_symbol(name: str) -> bool:
    return bool(_DEVRT_NAME_RE.match(name))


def ptx_devrt_references(ptx: bytes) -> list[str]:
    """The device-runtime functions a PTX module declares extern (and so calls)."""
    return sorted({m.decode() for m in _PTX_EXTERN_RE.findall(ptx)})


def elf_devrt_references(code: bytes) -> list[str]:
    """The device-runtime functions a (relocatable) cubin leaves undefined."""
    from ..formats import ElfFile
    names = {s.name for s in ElfFile(code).symbols if s.shndx == 0 and s.name}
    return sorted(n for n in names if is_devrt_symbol(n))


def defined_symbols(code: bytes, kind: str) -> set[str]:
    """Functions an input defines (so a reference to them is not a device-runtime call)."""
    if kind == "ptx":
        return {m.decode() for m in _PTX_DEFINED_RE.findall(code)}
    if kind in ("cubin", "object"):
        from ..formats import ElfFile
        return {s.name for s in ElfFile(code).symbols if s.shndx != 0 and s.name}
    return set()


def references(code: bytes, kind: str) -> list[str] | None:
    """Device-runtime references of one input; None where the bytes cannot tell (LTO-IR,
    archives, fatbins whose entries cannot be read, host objects)."""
    if kind == "ptx":
        return ptx_devrt_references(code)
    if kind in ("cubin", "object"):
        return elf_devrt_references(code)
    if kind == "fatbin":
        try:
            from ..formats import fatbin_entries as entries
            found: set[str] = set()
            for e in entries(code, "fatbin"):
                if e.kind in ("ptx", "cubin", "object"):
                    found.update(references(e.code, e.kind) or ())
                elif e.kind == "ltoir":
                    return None
            return sorted(found)
        except Exception:  # no container reader, or compressed entries
            return None
    return None


def _search_dirs() -> list[Path]:
    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # some virtualenv layouts lack it
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p]
    seen: list[Path] = []
    for d in dirs:
        p = Path(d)
        if p not in seen and p.is_dir():
            seen.append(p)
    return seen


def configured() -> Path | None:
    """$KJIT_CUDADEVRT, None when unset."""
    env = env_text(ENV_DEVRT)
    return Path(env) if env is not None else None


def candidates() -> list[Path]:
    """Every libcudadevrt.a kjit can see, preferred first."""
    found: list[Path] = []
    chosen = configured()
    if chosen is not None:
        found.append(chosen)
    for d in _search_dirs():
        for hit in sorted(glob.glob(str(d / "nvidia" / "*" / "lib" / "libcudadevrt.a"))):
            p = Path(hit)
            if p not in found:
                found.append(p)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            p = Path(root) / "lib64" / "libcudadevrt.a"
            if p.is_file() and p not in found:
                found.append(p)
    return found


def find(linker_major: int | None = None) -> Path | None:
    """The libcudadevrt.a to link: $KJIT_CUDADEVRT, else the wheel for the linker's CUDA
    major version (nvidia/cu13/lib for nvJitLink 13), else any found; None if none."""
    cands = candidates()
    chosen = configured()
    if chosen is not None:
        if not chosen.is_file():
            raise LinkError(f"{ENV_DEVRT}={chosen} does not name a file (expected libcudadevrt.a)")
        return chosen
    if linker_major is None:
        return cands[0] if cands else None
    from ..families import RUNTIME_WHEEL_DIRS
    for p in cands:
        if p.parent.parent.name in RUNTIME_WHEEL_DIRS.get(linker_major, (f"cu{linker_major}",)):
            return p
    # another family's wheel is never used: nvJitLink cannot read a newer major's objects
    others = {d for dirs in RUNTIME_WHEEL_DIRS.values() for d in dirs}
    rest = [p for p in cands if p.parent.parent.name not in others]
    return rest[0] if rest else None


def require(linker_major: int | None, why: Sequence[str], inputs: Iterable[str]) -> Path:
    """find(), or a LinkError that says which wheel to install."""
    path = find(linker_major)
    if path is not None:
        return path
    major = linker_major or 13
    wheel = ("nvidia-cuda-runtime" if major >= 13 else
             f"'nvidia-cuda-runtime-cu{major}>=12.8'" if major == 12 else f"nvidia-cuda-runtime-cu{major}")
    why_text = (f"this code launches kernels from the device (it calls {', '.join(why[:4])}), "
                "so it must be linked with" if why else "LinkOptions.device_runtime=True asks for")
    raise LinkError(
        f"{why_text} the CUDA device runtime, libcudadevrt.a, which is not installed: "
        f"pip install {wheel} (or set {ENV_DEVRT}=/path/to/libcudadevrt.a)",
        symbol=why[0] if why else None, inputs=list(inputs))
