"""Parallel compiles for a build.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import CompileError, InvalidOptionError, KjitError

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
        opts = {name: _jsonable(value) for name, value in self.options.as_dict().items()}
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


_WORKER = "from kjit.build.workers import worker_main; worker_main()"


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
                        request = compiler.request(units[i])
                    except Exception as exc:  # reported in the caller's thread, never lost here
                        errors[i] = exc
                        break
                    try:
                        proc.stdin.write(request + "\n")
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
        from ..compiler.diagnostics import compile_error
        return compile_error(reply["message"], log=reply.get("log", ""),
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

