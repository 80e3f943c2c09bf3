"""run_build: compile every (source, arch) through the cache, link where asked, pack one fatbin."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..compiler import source_name
from ..errors import InvalidOptionError
from .archs import resolve_archs, resolve_ptx
from .units import SharedOptions, Unit, compile_units

COMPRESS_CHOICES = ("none", "speed", "balance", "size")

@dataclass
class BuildResult:
    output: Path
    object: Any                      # the fatbin / hipfb ObjectCode
    entries: list[dict] = field(default_factory=list)
    compiles: int = 0
    reused: int = 0
    links: int = 0
    links_reused: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"output": str(self.output), "kind": self.object.kind, "size": len(self.object.code),
                "entries": self.entries, "symbols": dict(self.object.symbols),
                "compiles": self.compiles, "reused": self.reused, "compiled": self.compiles - self.reused,
                "links": self.links, "links_reused": self.links_reused,
                "seconds": round(self.seconds, 3), "notes": self.notes}


def run_build(sources: Sequence[str | os.PathLike[str]], *, output: str | os.PathLike[str] | None = None,
              archs: Sequence[str] = (), ptx: Sequence[str] = (), no_ptx: bool = False,
              options: Any = None, link: Sequence[str | os.PathLike[str]] = (), lto: bool = False,
              name_expressions: Sequence[str] = (), backend: str = "cuda", jobs: int | None = None,
              compress: str = "none", cache: bool = True,
              progress: Callable[[int], Any] | None = None,
              save: Callable[[Any, Path], Any] | None = None) -> BuildResult:
    """Build one fatbin (CUDA) or offload bundle (HIP) from source files; see `kjit build`.

    progress, if given, is called once with the number of compiles and must return a
    callable invoked after each compile. save(obj, path) writes the result (default: make
    the directory, then obj.save(path))."""
    from ..compiler import CompileOptions
    from .pack import make_bundle, make_fatbin, merge_symbols
    from ..objectcode import ObjectCode

    t0 = time.perf_counter()
    paths = [Path(s) for s in sources]
    if not paths:
        raise InvalidOptionError("kjit build needs at least one source file")
    options = options or CompileOptions()
    if jobs is not None and jobs < 1:
        raise InvalidOptionError(f"--jobs must be at least 1, got {jobs}")
    from ..compiler import pool_size
    jobs = pool_size(jobs)   # --jobs, else $KJIT_COMPILE_JOBS, else this process's cores
    exprs = tuple(name_expressions)
    linked = len(paths) > 1 or bool(link) or lto
    if exprs and len(paths) > 1:
        raise InvalidOptionError("--name-expression works with one source file: the template "
                                 "must be instantiated in the source that defines it")
    from ..compiler import read_source
    texts = [read_source(p) for p in paths]
    result_notes: list[str] = []

    if backend == "hip":
        if linked or ptx:
            raise InvalidOptionError("--backend hip builds one source per bundle: --link, --lto, "
                                     "--ptx and several sources are CUDA-only")
        arch_list = resolve_archs(archs, "hip")
        units = [Unit(texts[0], source_name(paths[0]), a, "hsaco") for a in arch_list]
    else:
        arch_list = resolve_archs(archs, "cuda")
        real = [a for a in arch_list if not a.startswith("compute_")]
        if no_ptx and len(real) < len(arch_list):
            raise InvalidOptionError("--arch compute_XX asks for PTX, which --no-ptx turns off: "
                                     "drop one of them")
        ptx_list = resolve_ptx(arch_list, list(ptx) + [a for a in arch_list if a.startswith("compute_")],
                               no_ptx)
        if linked and ptx_list:
            if ptx:
                raise InvalidOptionError(
                    "--ptx cannot be combined with --link, --lto or several sources: the linker "
                    "produces cubins; drop --ptx (or --no-ptx)")
            result_notes.append("no PTX embedded: linked builds contain cubins only")
            ptx_list = []
        if not real and not ptx_list:
            raise InvalidOptionError("nothing to build: give at least one sm_XX --arch or a --ptx arch")
        if linked:
            target = "ltoir" if lto else "cubin"
            opts = options if lto else options.replace(relocatable=True)
            units = [Unit(t, source_name(p), a, target) for a in real for p, t in zip(paths, texts)]
        else:
            opts = options
            units = [Unit(texts[0], source_name(paths[0]), a, "cubin") for a in real]
            units += [Unit(texts[0], source_name(paths[0]), a, "ptx") for a in ptx_list]
        options = opts

    shared = SharedOptions(options, exprs, backend, cache)
    tick = progress(len(units)) if progress else (lambda: None)
    objs = compile_units(units, shared, jobs, tick)
    res = BuildResult(output=Path(output) if output else paths[0].with_suffix(
        ".hipfb" if backend == "hip" else ".fatbin"), object=None, notes=result_notes)
    res.compiles = len(objs)
    res.reused = sum(1 for o in objs if o.cache_hit)
    res.logs = sorted({o.log.strip() for o in objs if o.log.strip()})

    def entry(kind, arch, code, hits, ms, sources_):
        return {"kind": kind, "arch": arch, "size": len(code), "sources": sources_,
                "cache_hit": hits, "ms": ms}

    if backend == "hip":
        out_obj = make_bundle(objs, name=res.output.name)
        res.entries = [entry("hsaco", o.arch, o.code, o.cache_hit, _ms(o), [o.name]) for o in objs]
    elif linked:
        link_objs = [ObjectCode.from_file(p) for p in link]
        # Merged once, from the compiles and the link inputs: each linked cubin carries the
        # same names, but one from the cache carries what its first link was given.
        symbols = merge_symbols([*objs, *link_objs])
        pieces = []
        for a in real:
            mine = [o for u, o in zip(units, objs) if u.arch == a]
            cubin, hit, ms = _link_one(mine + link_objs, a, lto, cache)
            res.links += 1
            res.links_reused += bool(hit)
            pieces.append(cubin)
            e = entry("cubin", a, cubin.code, bool(hit) and all(o.cache_hit for o in mine),
                      None if hit else ms, [o.name for o in mine] + [str(p) for p in link])
            e["linked"] = True
            res.entries.append(e)
        out_obj = make_fatbin(pieces, compress=compress, name=res.output.name, symbols=symbols)
    else:
        out_obj = make_fatbin(objs, compress=compress, name=res.output.name)
        res.entries = [entry(o.kind, o.arch, o.code, o.cache_hit, _ms(o), [o.name]) for o in objs]
    _sizes_as_stored(res.entries, out_obj)
    (save or _save)(out_obj, res.output)
    res.object = out_obj
    res.seconds = time.perf_counter() - t0
    return res


def _sizes_as_stored(entries: list[dict], container: Any) -> None:
    """Report each entry as the output holds it, read back with the reader `kjit inspect`
    uses: nvFatbin strips PTX comments and whitespace, and compression changes what is
    stored, so the compiler's own sizes would disagree with the file."""
    from ..formats import fatbin_entries as read_entries
    stored = [e for e in read_entries(container.code, container.kind) if e.kind != "host"]
    if container.kind == "hipfb":  # written in order, one per compiled code object
        pairs = list(zip(entries, stored))
    else:
        pool, pairs = list(stored), []
        for e in entries:
            match = next((s for s in pool if (s.kind, s.arch) == (e["kind"], e["arch"])), None)
            if match is not None:
                pool.remove(match)
                pairs.append((e, match))
    for e, s in pairs:
        e["size"], e["stored_size"] = s.size, s.stored_size or s.size


def _save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    obj.save(path)


def _link_one(inputs: list, arch: str, lto: bool, cache: bool):
    from ..linker import link as kjit_link
    # nvJitLink, never the driver linker: the output must not depend on the build machine.
    # The result is a cubin ObjectCode carrying the inputs' symbols and declarations.
    result = kjit_link(inputs, arch=arch, backend="nvjitlink", lto=lto, cache=cache)
    return (result.with_(arch=arch, name=f"linked.{arch}"), result.cache_hit,
            round(result.wall_time_ms, 3))


def _ms(obj: Any) -> float | None:
    ms = obj.metadata.get("compile_ms")
    return None if obj.cache_hit else ms

