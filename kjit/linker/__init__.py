"""kjit.link: link PTX, cubins, fatbins, LTO-IR, host objects and archives into one cubin.

Two linkers: the driver's (cuLink*, needs a GPU) and nvJitLink (no GPU, LTO-IR, and PTX
newer than the driver). backend="auto" picks one per link and says why (LinkResult.reason).
Results are cached by the digests of the inputs, the options, the arch and the linker.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

from .. import arch as arch_mod
from ..errors import InvalidOptionError, LinkError
from ..formats import ElfFormatError
from ..objectcode import ObjectCode, merge_declarations
from . import devrt
from .choice import BACKENDS, Choice, choose_backend, cuda_version_text, ptx_too_new
from .inputs import InputLike, LinkInput, check_inputs, normalize
from .options import LinkOptions
from .result import LinkResult

__all__ = ["link", "ptx_to_cubin", "LinkOptions", "LinkResult", "BACKENDS", "LinkInput"]


def link(inputs: Iterable[InputLike] | InputLike, *, arch: str | None = None,
         backend: str = "auto", lto: bool = False, options: LinkOptions | None = None,
         cache: bool = True) -> LinkResult:
    """Link `inputs` (kjit.ObjectCode, cuda.core ObjectCode, bytes, PTX text or file paths;
    kinds are sniffed) into a cubin: a LinkResult, which is an ObjectCode holding the inputs'
    name-expression symbols and declarations (so its kernels' parameters stay typed).

    arch: "sm_90" (default: the current GPU, else $KJIT_ARCH, else the inputs' common arch).
    backend: "auto", "driver" or "nvjitlink". lto: link-time optimisation (turned on by
    itself when an input is LTO-IR, which needs it). The CUDA device runtime is linked in
    when relocatable code launches kernels from the device (LinkOptions.device_runtime).
    Raises InvalidOptionError for bad inputs or options, LinkError (with both logs, the
    failing input and any undefined symbol) when the link fails.
    """
    if options is None:
        options = LinkOptions()
    elif not isinstance(options, LinkOptions):
        raise InvalidOptionError("options must be a kjit.LinkOptions")
    if backend not in BACKENDS:
        raise InvalidOptionError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
    items = normalize(inputs, check=False)  # the structure is checked only to link (create)
    kinds = {i.kind for i in items}
    lto = bool(lto) or "ltoir" in kinds
    if options.fast_math and not lto:
        raise InvalidOptionError("fast_math applies to LTO links: pass lto=True with LTO-IR inputs")

    gpu, driver_version = _machine() if backend != "nvjitlink" or arch is None else (False, None)
    target = _target_arch(arch, items, gpu)
    try:   # reads the inputs' symbols and notes
        needed_for = _devrt_needed(items, options)
        add_devrt = bool(needed_for) or options.device_runtime is True
        choice = choose_backend(
            backend, kinds=kinds, ptx_versions=[v for i in items if (v := i.ptx_version)],
            cubin_versions=[v for i in items if (v := i.toolkit_version)], lto=lto,
            gpu_present=gpu, driver_version=driver_version,
            nvjitlink_only_options=bool(options.extra), device_runtime=add_devrt,
            arch_specific=bool(target.suffix))
    except ElfFormatError:
        check_inputs(items)   # a damaged input: named as the structure check names it
        raise
    libraries: list[Path] = []
    if add_devrt:
        libraries.append(devrt.require(_linker_major(choice.backend, driver_version),
                                       needed_for or [], [i.name for i in items]))
        keyed_devrt: Path | None = libraries[0]
    elif needed_for is None:
        # The bytes cannot tell (LTO-IR); a retry may add the one found now: key on it.
        keyed_devrt = devrt.find(_linker_major(choice.backend, driver_version))
    else:
        keyed_devrt = None

    key: dict[str, Any] = {
        "inputs": [[i.kind, i.digest] for i in items],
        "arch": target.name,
        "backend": choice.backend,
        "linker": _linker_version(choice.backend, driver_version),
        "lto": lto,
        "options": options.describe(),
        "device_runtime": _file_digest(keyed_devrt) if keyed_devrt else None,
    }
    names = [i.name for i in items]

    def create() -> ObjectCode:
        check_inputs(items)   # what would crash a linker, refused before one runs
        return _run(items, target, choice, options, lto, libraries, backend == "auto",
                    may_need_devrt=needed_for is None and not add_devrt)

    from ..cache import get_or_create
    obj = get_or_create("link", key, create, enabled=cache,
                        label="link " + ", ".join(names[:3]) + (" ..." if len(names) > 3 else ""))
    return LinkResult.from_object(_with_declarations(obj, items))


def _with_declarations(obj: ObjectCode, items: list[LinkInput]) -> ObjectCode:
    """The linked code with the inputs' declarations (the parameter types kjit.load needs),
    merged. Taken from these inputs, not the cache entry: the key is the inputs' bytes, and
    the same PTX read from a file (no declarations) and fresh from kjit.compile are one input."""
    merged = merge_declarations(i.declarations for i in items)
    if obj.declarations == merged:
        return obj
    metadata = {k: v for k, v in obj.metadata.items() if k != "declarations"}
    if merged:
        metadata["declarations"] = merged
    return obj.with_(metadata=metadata)


# --- the machine --------------------------------------------------------------------

def _machine() -> tuple[bool, int | None]:
    """(a GPU is present, cuDriverGetVersion or None)."""
    from .. import driver
    if not driver.available():
        return False, None
    return True, driver.driver_version()


def _target_arch(arch: Any, items: list[LinkInput], gpu: bool) -> arch_mod.Arch:
    """The real arch to link for: given, else the device, $KJIT_ARCH, the inputs' own."""
    if arch is not None:
        a = arch_mod.parse(arch)
    else:
        # the device, else $KJIT_ARCH (one that is no target is an error), else the inputs'
        a = (arch_mod.device_arch() if gpu else None) or arch_mod.from_env() or _inputs_arch(items)
    if a.backend != "cuda":
        raise InvalidOptionError(f"arch {a.name!r} is not a CUDA architecture: kjit.link makes cubins")
    return arch_mod.parse(a.sm)  # compute_90 links to sm_90: the output is a cubin


def _inputs_arch(items: list[LinkInput]) -> arch_mod.Arch:
    found = {arch_mod.parse(i.arch).sm for i in items if i.arch and i.arch[:2] in ("sm", "co")}
    if len(found) == 1:
        return arch_mod.parse(found.pop())
    have = f" (the inputs are for {', '.join(sorted(found))})" if found else ""
    raise InvalidOptionError(
        f"no architecture given and none can be detected (no GPU here){have}: pass "
        f"arch='sm_90' (or --arch sm_90), or set {arch_mod.ENV_ARCH}=sm_90")


# --- device runtime -----------------------------------------------------------------

def _devrt_needed(items: list[LinkInput], options: LinkOptions) -> list[str] | None:
    """The device-runtime functions the inputs call ([] for none); None when some input's
    bytes cannot tell (LTO-IR, archives): the link is then retried with it if needed."""
    if options.device_runtime is False:
        return []
    refs: set[str] = set()
    defined: set[str] = set()
    unknown = False
    for i in items:
        if i.kind == "library":
            continue  # archives are searched for symbols, they do not bring new references
        r = devrt.references(i.code, i.kind)
        if r is None:
            unknown = True
        else:
            refs.update(r)
        defined |= devrt.defined_symbols(i.code, i.kind)
    needed = sorted(refs - defined)
    if needed:
        return needed
    return None if unknown else []


def _linker_major(backend: str, driver_version: int | None) -> int | None:
    if backend == "driver" and driver_version:
        return driver_version // 1000
    from . import nvjitlink
    try:
        return nvjitlink.version()[0]
    except LinkError:
        return None


def _linker_version(backend: str, driver_version: int | None) -> str:
    if backend == "driver":
        return f"driver {driver_version}"
    from . import nvjitlink
    return "nvJitLink " + ".".join(map(str, nvjitlink.version()))


_file_digests: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    st = path.stat()
    memo = (str(path), st.st_size, st.st_mtime_ns)
    if memo not in _file_digests:
        _file_digests[memo] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _file_digests[memo]


# --- running the link ---------------------------------------------------------------

def _run(items: list[LinkInput], target: arch_mod.Arch, choice: Choice, options: LinkOptions,
         lto: bool, libraries: list[Path], auto: bool, *, may_need_devrt: bool) -> ObjectCode:
    from . import culink, nvjitlink
    from .culink import PtxTooNewForDriver

    def attempt(choice: Choice, libs: list[Path]):
        if choice.backend == "driver":
            return culink.link(items, arch=target.sm, options=options, libraries=libs)
        return nvjitlink.link(items, arch=target.name, options=options, lto=lto, libraries=libs)

    try:
        linked = attempt(choice, libraries)
    except PtxTooNewForDriver:
        if not auto:
            raise
        choice = Choice("nvjitlink", "the driver rejected the PTX version (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)")
        linked = attempt(choice, libraries)
    except LinkError as exc:
        from .diagnostics import undefined_symbols
        missing = [s for s, _ in undefined_symbols(exc.error_log + "\n" + exc.info_log)]
        if not (may_need_devrt and missing and all(devrt.is_devrt_symbol(s) for s in missing)):
            raise
        # LTO-IR calls into the device runtime that its bytes did not show: link it in.
        libraries = [devrt.require(_linker_major(choice.backend, None), missing,
                                   [i.name for i in items])]
        linked = attempt(choice, libraries)

    symbols: dict[str, str] = {}
    for i in items:
        symbols.update(i.symbols)
    return ObjectCode(
        linked.code, kind="cubin", arch=target.name, log=linked.info_log, symbols=symbols,
        name=Path(items[0].name.split("#")[0]).stem + ".cubin",
        metadata={
            "backend": choice.backend, "reason": choice.reason,
            "linker": _linker_version(choice.backend, _driver_version_or_none(choice.backend)),
            "link_ms": round(linked.wall_time_ms, 3), "error_log": linked.error_log,
            "inputs": [i.name for i in items], "lto": lto, "options": options.describe(),
            "device_runtime": str(libraries[0]) if libraries else None,
        })


def _driver_version_or_none(backend: str) -> int | None:
    if backend != "driver":
        return None
    from .culink import version
    return version()


def ptx_to_cubin(ptx: bytes, arch: str, *, cache: bool = True) -> ObjectCode:
    """Compile one PTX module to a cubin for `arch` with nvJitLink; no GPU needed.

    The module loader uses this for PTX newer than the driver accepts. Cached like any link.
    """
    a = arch_mod.parse(arch)
    if a.backend != "cuda":
        raise InvalidOptionError(f"ptx_to_cubin needs a CUDA arch (sm_XY), got {arch!r}")
    if isinstance(ptx, str):
        ptx = ptx.encode()
    obj = ObjectCode(bytes(ptx), kind="ptx", name="module.ptx")
    return link([obj], arch=a.sm, backend="nvjitlink", cache=cache).object
