"""What selects a tuning entry: the key arguments' values, the device, the kernel's source.

Ints, floats and bools are keyed by value; arrays (anything with .shape and .dtype: kjit,
PyTorch, CuPy, numpy) by dtype and shape; nothing else, so a pointer or a stream never
makes a new entry. Argument names come from the kernel's own signature in its source."""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from ..compiler import KERNEL_RE as KERNEL, strip_comments
from ..errors import ArgumentError


def key_value(name: str, value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    shape = getattr(value, "shape", None)
    typestr = getattr(value, "typestr", None)   # a kjit array: its dtype without numpy
    if shape is not None and isinstance(typestr, str):
        from ..runtime import DTYPE_NAMES as NAMES
        return {"shape": [int(d) for d in shape], "dtype": NAMES.get(typestr, typestr)}
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return {"shape": [int(d) for d in shape], "dtype": str(dtype).replace("torch.", "")}
    raise ArgumentError(f"key argument {name!r} is a {type(value).__name__}: key arguments must be "
                        "numbers (sizes) or arrays (keyed by dtype and shape)")


def key_values(key: Sequence[str], named: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name in key:
        if name not in named:
            raise ArgumentError(f"key names argument {name!r}, which the kernel does not have "
                                f"(its arguments: {', '.join(named) or 'none'})")
        out[name] = key_value(name, named[name])
    return out


def parameter_names(source: str, kernel: str) -> list[str] | None:
    """The parameter names of `kernel` (a name or name expression) as declared in `source`,
    or None if the declaration is not found."""
    base = kernel.split("<", 1)[0].strip().split("::")[-1]
    text = strip_comments(source)
    for m in KERNEL.finditer(text):
        if m.group(1) == base:
            names = []
            for p in _split_params(m.group(2)):
                p = re.sub(r"\[[^\]]*\]\s*$", "", p.split("=", 1)[0]).strip()
                found = re.findall(r"[A-Za-z_]\w*", p)
                if p and p != "void":
                    if not found:
                        return None
                    names.append(found[-1])
            return names
    return None


def _split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def name_args(names: Sequence[str] | None, args: Sequence[Any], kwargs: Mapping[str, Any],
              what: str) -> dict[str, Any]:
    """The launch's arguments by name (positional ones named in signature order)."""
    if names is None:
        if kwargs:
            raise ArgumentError(f"{what}: keyword arguments need the kernel's parameter names; "
                                "give arg_names=[...]")
        return {str(i): a for i, a in enumerate(args)}
    if len(args) > len(names):
        raise ArgumentError(f"{what} takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")
    named = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names:
            raise ArgumentError(f"{what} has no parameter {k!r} (it has {', '.join(names)})")
        if k in named:
            raise ArgumentError(f"{what}: argument {k!r} given twice")
        named[k] = v
    missing = [n for n in names if n not in named]
    if missing:
        raise ArgumentError(f"{what}: missing argument(s) {', '.join(missing)}")
    return named


def _device(ordinal: int) -> dict[str, Any]:
    from .. import driver
    from ..runtime import Device
    dev = Device(ordinal)
    major, minor = driver.compute_capability(ordinal)
    return {"name": dev.name, "sms": dev.attribute("multiprocessor_count"), "cc": f"{major}.{minor}",
            "driver": int(driver.call(driver.bindings().cuDriverGetVersion))}


def current_device() -> dict[str, Any]:
    """The current device as tuning results are filed: name, SM count, compute capability and
    driver version (a different clock or SM count is a different device)."""
    from .. import driver
    driver.ensure_context()   # the thread's current context decides which device
    return _device(int(driver.call(driver.bindings().cuCtxGetDevice)))
