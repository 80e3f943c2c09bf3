"""The compile worker's side of kjit.compiler.pool: one JSON request per stdin line, one JSON
reply per stdout line, each served by kjit.compile in this process. A worker started "once"
serves one request and exits (its NVRTC may carry that compile's flags into the next)."""
from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from typing import Any, Callable

from ..errors import KjitError
from .pool import idle_timeout, jsonable, kjit_dir


def _watch_parent(ppid: int) -> None:
    """End this worker as soon as its parent is gone, even in the middle of a compile."""
    def watch() -> None:
        while True:
            if os.getppid() != ppid:
                pch = sys.modules.get("kjit.compiler.pch")
                if pch is not None:  # os._exit skips atexit: its PCH files go first
                    pch.cleanup()
                os._exit(0)
            time.sleep(0.2)
    threading.Thread(target=watch, daemon=True).start()


def worker_main(expected_kjit: str, ppid: int, once: bool = False) -> None:
    """A worker: one JSON request per stdin line, one JSON reply per stdout line; `once`:
    the first request only."""
    import select
    out, inp = sys.stdout, sys.stdin.buffer
    sys.stdout = sys.stderr   # nothing else may write into the reply pipe
    _watch_parent(ppid)
    hello: dict[str, Any] = {"kjit": str(kjit_dir()), "pid": os.getpid()}
    if hello["kjit"] != expected_kjit:
        hello["error"] = f"sys.path[0] is {sys.path[0]}"
    out.write(json.dumps(hello) + "\n")
    out.flush()
    if "error" in hello:
        return
    from . import cached
    from .cached import compile as kjit_compile   # loaded while the parent prepares requests
    cached._ONE_COMPILE_WORKER[0] = once
    from .options import CompileOptions
    idle = idle_timeout()
    while True:
        ready, _, _ = select.select([inp], [], [], idle)
        if not ready:
            return   # idle too long: the parent starts a new worker when it needs one
        line = inp.readline()
        if not line:
            return   # the parent closed the pipe or died
        reply = _serve(json.loads(line), kjit_compile, CompileOptions)
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()
        if once:
            return   # its NVRTC may carry the compile's flags into the next one


def _serve(req: dict, kjit_compile: Callable[..., Any], options_cls: type) -> dict:
    from ..errors import CompileError
    from .pch import expect_repeats
    # the parent sends more of this prologue to this worker: a PCH pays from the first
    token = expect_repeats.set(bool(req.get("pch_repeat")))
    try:
        obj = kjit_compile(req["source"], arch=req["arch"], target=req["target"],
                           options=options_cls(**req["options"]),
                           name_expressions=tuple(req["name_expressions"]),
                           backend=req["backend"], name=req["name"], cache=req["cache"])
        return {"ok": True, "code": base64.b64encode(obj.code).decode(), "kind": obj.kind,
                "arch": obj.arch, "log": obj.log, "symbols": dict(obj.symbols),
                "name": obj.name, "metadata": jsonable(dict(obj.metadata)),
                "cache_hit": obj.cache_hit}
    except CompileError as exc:
        return {"ok": False, "error": "CompileError", "message": exc.message, "log": exc.log,
                "options": list(exc.options), "compiler": exc.compiler}
    except KjitError as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    except Exception as exc:  # reported to the parent, which shows it as a KjitError
        return {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}
    finally:
        expect_repeats.reset(token)
