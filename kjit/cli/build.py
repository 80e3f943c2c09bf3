"""`kjit build`: one fatbin (or HIP offload bundle) for many architectures, on any machine.

One compile per (source, architecture), each through the cache, run in parallel; then the
cubins (and PTX for forward compatibility) are packed with nvFatbin. Lowered names of
--name-expression templates go to the `<output>.kjit.json` sidecar, which
ObjectCode.from_file and kjit.load read back.

NVRTC serialises compiles inside one process (it releases the GIL, but a second thread
gains nothing: measured), so parallel compiles run in worker processes that speak JSON
lines over pipes. A rebuild whose compiles all hit the cache never starts a worker.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from ..errors import CompileError, InvalidOptionError, KjitError
from .common import compile_flags, compile_options_from_cli, emit, fail, json_option

COMPRESS_CHOICES = ("none", "speed", "balance", "size")


# --- architectures ---------------------------------------------------------------------
def resolve_archs(values: Sequence[str], backend: str = "cuda") -> list[str]:
    """The architectures named by --arch values (comma lists, `all`, `native`, families),
    validated against the installed compiler, sorted and without duplicates."""
    from .. import arch as arch_mod
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
            out += [arch_mod.parse(f"sm_{n}") for n in arch_mod.nvrtc_supported()]
        elif low == "native":
            out += _native_archs(backend)
        else:
            a = arch_mod.parse(name, backend)
            arch_mod.check_supported(a)
            out.append(a)
    unique = {a.name: a for a in out}
    return [a.name for a in sorted(unique.values(), key=lambda a: (a.number, a.suffix, a.name))]


def _native_archs(backend: str) -> list[Any]:
    from .. import arch as arch_mod, driver
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
        arch_mod.check_supported(a)
    return found


def resolve_ptx(archs: Sequence[str], ptx_values: Sequence[str], no_ptx: bool) -> list[str]:
    """The virtual architectures to embed PTX for: --ptx values, else compute_<newest real
    arch> (plain, so any later GPU can JIT it), none with --no-ptx."""
    from .. import arch as arch_mod
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
        arch_mod.check_supported(a)
        out[a.compute] = a
    return [n for n, _ in sorted(out.items(), key=lambda kv: (kv[1].number, kv[1].suffix))]


# --- compile units and the worker pool ---------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """One compile: a source for one architecture and target."""

    source: str
    name: str
    arch: str
    target: str


@dataclass
class _Compiler:
    options: Any
    name_expressions: tuple[str, ...]
    backend: str
    cache: bool

    def one(self, unit: Unit):
        from ..compiler.api import compile as kjit_compile
        return kjit_compile(unit.source, arch=unit.arch, target=unit.target,
                            options=self.options, name_expressions=self.name_expressions,
                            backend=self.backend, name=unit.name, cache=self.cache)

    def request(self, unit: Unit) -> str:
        opts = {f.name: _jsonable(getattr(self.options, f.name)) for f in fields(self.options)}
        return json.dumps({"source": unit.source, "name": unit.name, "arch": unit.arch,
                           "target": unit.target, "options": opts,
                           "name_expressions": list(self.name_expressions),
                           "backend": self.backend, "cache": self.cache})


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


# What starting a worker costs (interpreter, imports, NVRTC's first compile), measured on
# the 2-core machines here at 0.25-0.35 s; parallel compiles pay off only above it.
WORKER_START_S = 0.35


def compile_units(units: Sequence[Unit], compiler: _Compiler, jobs: int,
                  on_done: Callable[[], None] = lambda: None) -> list:
    """ObjectCode for each unit, in order. Compiles in-process while they hit the cache or
    are quick; once the remaining misses would take longer than starting workers, the
    rest go to `jobs` worker processes."""
    results: list = [None] * len(units)
    pending = list(range(len(units)))
    missed, miss_time = 0, 0.0
    while pending:
        i = pending.pop(0)
        t0 = time.perf_counter()
        results[i] = compiler.one(units[i])
        on_done()
        if results[i].cache_hit is True:
            continue
        missed, miss_time = missed + 1, miss_time + time.perf_counter() - t0
        workers = min(jobs, len(pending))
        saved = miss_time / missed * len(pending) * (1 - 1 / workers) if workers > 1 else 0.0
        if saved > WORKER_START_S:
            break
    if pending:
        for i, obj in zip(pending, _pool(units, pending, compiler, jobs, on_done)):
            results[i] = obj
    return results


_WORKER = "from kjit.cli.build import worker_main; worker_main()"


def _pool(units: Sequence[Unit], indices: list[int], compiler: _Compiler, jobs: int,
          on_done: Callable[[], None]) -> list:
    """Compile units[indices] in worker processes; results in the order of `indices`."""
    from ..objectcode import ObjectCode
    import kjit
    env = dict(os.environ)
    root = str(Path(kjit.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    todo = list(indices)
    lock = threading.Lock()
    out: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def serve() -> None:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env, text=True)
            try:
                while True:
                    with lock:
                        if not todo or errors:
                            break
                        i = todo.pop(0)
                    try:
                        proc.stdin.write(compiler.request(units[i]) + "\n")
                        proc.stdin.flush()
                        line = proc.stdout.readline()
                    except OSError:
                        line = ""
                    if not line:
                        err.seek(0)
                        text = err.read().decode("utf-8", "replace").strip()
                        errors[i] = KjitError(f"a kjit build worker died compiling {units[i].name} "
                                              f"for {units[i].arch}: {text[-2000:] or 'no output'}")
                        break
                    reply = json.loads(line)
                    if reply["ok"]:
                        out[i] = ObjectCode(base64.b64decode(reply["code"]), kind=reply["kind"],
                                            arch=reply["arch"], log=reply["log"],
                                            symbols=reply["symbols"], name=reply["name"],
                                            metadata=reply["metadata"], cache_hit=reply["cache_hit"])
                        with lock:
                            on_done()
                    else:
                        errors[i] = _error_from(reply, units[i])
            finally:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait()

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(min(jobs, len(indices)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[min(errors)]
    return [out[i] for i in indices]


def _error_from(reply: dict, unit: Unit) -> KjitError:
    from .. import errors as errors_mod
    if reply.get("error") == "CompileError":
        return CompileError(reply["message"], log=reply.get("log", ""),
                            options=reply.get("options", ()), source=unit.source,
                            name=unit.name, compiler=reply.get("compiler", "NVRTC"))
    cls = getattr(errors_mod, reply.get("error", ""), None)
    if isinstance(cls, type) and issubclass(cls, KjitError) and cls in (
            InvalidOptionError, KjitError, errors_mod.CudaUnavailableError):
        return cls(reply["message"])
    return KjitError(reply["message"])


def worker_main() -> None:
    """A build worker: one JSON compile request per stdin line, one JSON reply per line."""
    from ..compiler.options import CompileOptions
    for line in sys.stdin:
        req = json.loads(line)
        try:
            compiler = _Compiler(CompileOptions(**req["options"]), tuple(req["name_expressions"]),
                                 req["backend"], req["cache"])
            obj = compiler.one(Unit(req["source"], req["name"], req["arch"], req["target"]))
            reply = {"ok": True, "code": base64.b64encode(obj.code).decode(), "kind": obj.kind,
                     "arch": obj.arch, "log": obj.log, "symbols": dict(obj.symbols),
                     "name": obj.name, "metadata": _jsonable(dict(obj.metadata)),
                     "cache_hit": obj.cache_hit}
        except CompileError as exc:
            reply = {"ok": False, "error": "CompileError", "message": exc.message, "log": exc.log,
                     "options": list(exc.options), "compiler": exc.compiler}
        except KjitError as exc:
            reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        except Exception as exc:  # reported to the parent, which shows it as a KjitError
            reply = {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply, default=str) + "\n")
        sys.stdout.flush()


# --- the build ---------------------------------------------------------------------------
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
              progress: Callable[[int], Any] | None = None) -> BuildResult:
    """Build one fatbin (CUDA) or offload bundle (HIP) from source files; see `kjit build`.

    progress, if given, is called once with the number of compiles and must return a
    callable invoked after each compile."""
    from ..compiler.options import CompileOptions
    from ..fatbin import make_fatbin
    from ..objectcode import ObjectCode

    t0 = time.perf_counter()
    paths = [Path(s) for s in sources]
    if not paths:
        raise InvalidOptionError("kjit build needs at least one source file")
    options = options or CompileOptions()
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise InvalidOptionError(f"--jobs must be at least 1, got {jobs}")
    exprs = tuple(name_expressions)
    linked = len(paths) > 1 or bool(link) or lto
    if exprs and len(paths) > 1:
        raise InvalidOptionError("--name-expression works with one source file: the template "
                                 "must be instantiated in the source that defines it")
    texts = []
    for p in paths:
        try:
            texts.append(p.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidOptionError(f"cannot read source {p}: {exc}") from None
    result_notes: list[str] = []

    if backend == "hip":
        if linked or ptx:
            raise InvalidOptionError("--backend hip builds one source per bundle: --link, --lto, "
                                     "--ptx and several sources are CUDA-only")
        arch_list = resolve_archs(archs, "hip")
        units = [Unit(texts[0], paths[0].name, a, "hsaco") for a in arch_list]
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
            units = [Unit(t, p.name, a, target) for a in real for p, t in zip(paths, texts)]
        else:
            opts = options
            units = [Unit(texts[0], paths[0].name, a, "cubin") for a in real]
            units += [Unit(texts[0], paths[0].name, a, "ptx") for a in ptx_list]
        options = opts

    compiler = _Compiler(options, exprs, backend, cache)
    tick = progress(len(units)) if progress else (lambda: None)
    objs = compile_units(units, compiler, jobs, tick)
    res = BuildResult(output=Path(output) if output else paths[0].with_suffix(
        ".hipfb" if backend == "hip" else ".fatbin"), object=None, notes=result_notes)
    res.compiles = len(objs)
    res.reused = sum(1 for o in objs if o.cache_hit)
    res.logs = sorted({o.log.strip() for o in objs if o.log.strip()})

    def entry(kind, arch, code, hits, ms, sources_):
        return {"kind": kind, "arch": arch, "size": len(code), "sources": sources_,
                "cache_hit": hits, "ms": ms}

    if backend == "hip":
        from ..hip.bundle import write_bundle
        code = write_bundle([(o.arch, o.code) for o in objs])
        symbols = _merged_symbols(objs)
        out_obj = ObjectCode(code, kind="hipfb", symbols=symbols, name=res.output.name)
        res.entries = [entry("hsaco", o.arch, o.code, o.cache_hit, _ms(o), [o.name]) for o in objs]
    elif linked:
        link_objs = [ObjectCode.from_file(p) for p in link]
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
        out_obj = make_fatbin(pieces, compress=compress, name=res.output.name,
                              symbols=_merged_symbols(objs))
    else:
        out_obj = make_fatbin(objs, compress=compress, name=res.output.name)
        res.entries = [entry(o.kind, o.arch, o.code, o.cache_hit, _ms(o), [o.name]) for o in objs]
    res.output.parent.mkdir(parents=True, exist_ok=True)
    out_obj.save(res.output)
    res.object = out_obj
    res.seconds = time.perf_counter() - t0
    return res


def _link_one(inputs: list, arch: str, lto: bool, cache: bool):
    from ..linker import link as kjit_link
    from ..objectcode import ObjectCode
    # nvJitLink, never the driver linker: the output must not depend on the build machine
    result = kjit_link(inputs, arch=arch, backend="nvjitlink", lto=lto, cache=cache)
    obj = result.object if getattr(result, "object", None) is not None else \
        ObjectCode(result.code, kind="cubin", arch=arch)
    if obj.kind != "cubin":
        obj = ObjectCode(obj.code, kind="cubin", arch=arch, name=obj.name)
    return (obj.with_(arch=arch, name=f"linked.{arch}"), obj.cache_hit,
            round(getattr(result, "wall_time_ms", 0.0), 3))


def _merged_symbols(objs: Sequence[Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for o in objs:
        for k, v in o.symbols.items():
            if out.setdefault(k, v) != v:
                raise InvalidOptionError(
                    f"name expression {k!r} lowers to {out[k]!r} for one arch and {v!r} for another")
    return out


def _ms(obj: Any) -> float | None:
    ms = obj.metadata.get("compile_ms")
    return None if obj.cache_hit else ms


def _human(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _text(d: dict[str, Any]) -> str:
    lines = [f"wrote {d['output']} ({d['kind']}, {_human(d['size'])}, {len(d['entries'])} "
             f"entries) in {d['seconds']:.2f} s"]
    for e in d["entries"]:
        verb = "linked" if e.get("linked") else "compiled"
        how = "reused from cache" if e["cache_hit"] else (
            f"{verb} ({e['ms']:.0f} ms)" if e.get("ms") is not None else verb)
        lines.append(f"  {e['kind']:<6} {e['arch']:<12} {_human(e['size']):>10}  {how}")
    if d["symbols"]:
        lines.append("  names: " + ", ".join(f"{k} -> {v}" for k, v in sorted(d["symbols"].items())))
    cache = f"cache: {d['reused']} of {d['compiles']} compiles reused"
    if d["links"]:
        cache += f", {d['links_reused']} of {d['links']} links reused"
    lines.append(cache)
    lines += [f"note: {n}" for n in d["notes"]]
    return "\n".join(lines)


@click.command("build")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Output file (default: the first source with .fatbin, or .hipfb for HIP).")
@click.option("--arch", "archs", multiple=True,
              help="Architectures, repeatable or comma-separated: sm_80,sm_90a,sm_100f, "
                   "`all` (every arch NVRTC supports), `native` (this machine's GPUs); gfx90a... "
                   "for HIP. Default: this GPU or $KJIT_ARCH.")
@click.option("--ptx", "ptx_archs", multiple=True,
              help="Embed PTX for these virtual archs (compute_90); default: compute_<newest --arch>.")
@click.option("--no-ptx", is_flag=True, help="Embed no PTX (no forward compatibility).")
@click.option("--link", "link_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Link with this file (LTO-IR, cubin, PTX, fatbin, .a), repeatable.")
@click.option("--lto", is_flag=True, help="Compile to LTO-IR and link with nvJitLink per arch.")
@click.option("--name-expression", "name_expressions", multiple=True,
              help="A template instantiation to compile and name, e.g. 'axpy<float>' (repeatable).")
@click.option("--backend", type=click.Choice(["cuda", "hip"]), default="cuda", show_default=True)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel compiles (default: the number of cores).")
@click.option("--compress", type=click.Choice(COMPRESS_CHOICES), default="none", show_default=True,
              help="nvFatbin compression of the entries.")
@click.option("--no-cache", is_flag=True, help="Compile even if the cache has the result.")
@compile_flags
@json_option
def build_cmd(sources, output, archs, ptx_archs, no_ptx, link_files, lto, name_expressions,
              backend, jobs, compress, no_cache, include_dirs, defines, std, fast_math, line_info,
              debug, max_registers, relocatable, extra, as_json):
    """Build SOURCES into one fatbin for many GPU architectures (no GPU needed)."""
    show_bar = not as_json and sys.stderr.isatty()
    bar_box: list = []

    def progress(total: int):
        if not show_bar or total < 2:
            return lambda: None
        bar = click.progressbar(length=total, label="compiling", file=sys.stderr)
        bar.__enter__()
        bar_box.append(bar)
        return lambda: bar.update(1)

    try:
        opts = compile_options_from_cli(std, defines, include_dirs, fast_math, line_info, debug,
                                        max_registers, relocatable, extra)
        result = run_build(sources, output=output, archs=archs, ptx=ptx_archs, no_ptx=no_ptx,
                           options=opts, link=link_files, lto=lto,
                           name_expressions=name_expressions, backend=backend, jobs=jobs,
                           compress=compress, cache=not no_cache, progress=progress)
    except KjitError as exc:
        raise fail(exc)
    finally:
        for bar in bar_box:
            bar.__exit__(None, None, None)
    for log in result.logs:
        click.echo(log, err=True)
    emit(result.summary(), as_json, _text)
