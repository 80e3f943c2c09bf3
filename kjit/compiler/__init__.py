"""Source to ObjectCode: NVRTC for CUDA, hiprtc for HIP.

The names below load on first use, so that importing one small module of this package (the
runtime reads `kjit.compiler.declarations`) does not import the whole compile path.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"compile": "api", "make_request": "request", "CompileRequest": "request",
         "CompileOptions": "options"}
__all__ = ["CompileOptions", "CompileRequest", "compile", "make_request"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
