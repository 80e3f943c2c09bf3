"""Config: one candidate of a tuning space, and the deterministic-mode switch.

A Config sets compile-time parameters (the keyword defaults of a `@kjit.kernel` source
function: template arguments, tile sizes, unroll depths written into the source), extra
`-D` defines, and launch geometry: `block`, `grid` and `shared_mem`, each a value or a
function of the launch's named arguments and the configuration's parameters.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..errors import ArgumentError
from ..settings import ENV_AUTOTUNE as ENV_MODE, AutotuneSettingError, autotune_mode, env_text


class Config:
    """One candidate: `Config({"BM": 128, "BN": 128}, block=256, grid=lambda m: ...)`.

    params: compile-time parameters (names of the source function's keyword defaults).
    block, grid, shared_mem: an int / tuple, or a callable taking one mapping `m` that holds
    the launch's named arguments and this configuration's params (m["M"], m["BM"]).
    defines: extra preprocessor macros for this candidate (added to the kernel's options).
    Geometry left out here comes from the autotune(...) defaults."""

    __slots__ = ("params", "block", "grid", "shared_mem", "defines")

    def __init__(self, params: Mapping[str, Any] | None = None, *, block: Any = None,
                 grid: Any = None, shared_mem: Any = None,
                 defines: Mapping[str, Any] | None = None, **more: Any):
        merged = dict(params or {}, **more)
        for k, v in merged.items():
            if not isinstance(k, str) or not k.isidentifier():
                raise ArgumentError(f"Config parameter names must be identifiers, got {k!r}")
            _json_value(v, f"Config parameter {k!r}")
        self.params = merged
        self.block = _geometry(block, "block")
        self.grid = _geometry(grid, "grid")
        if shared_mem is not None and not callable(shared_mem) and (
                isinstance(shared_mem, bool) or not isinstance(shared_mem, int) or shared_mem < 0):
            raise ArgumentError(f"Config shared_mem must be a byte count or a function, got {shared_mem!r}")
        self.shared_mem = shared_mem
        defs = {}
        for k, v in (defines or {}).items():
            if not isinstance(k, str) or not k.isidentifier():
                raise ArgumentError(f"Config define names must be identifiers, got {k!r}")
            defs[k] = None if v is None else str(v)
        self.defines = defs

    def with_defaults(self, block: Any, grid: Any, shared_mem: Any) -> "Config":
        """This config with the geometry it leaves out taken from the autotune defaults."""
        return Config(self.params, block=self.block if self.block is not None else block,
                      grid=self.grid if self.grid is not None else grid,
                      shared_mem=self.shared_mem if self.shared_mem is not None else shared_mem,
                      defines=self.defines)

    def describe(self) -> dict[str, Any]:
        """The JSON-able identity of this config (a function is keyed by its name: the
        source it shapes is keyed separately)."""
        out: dict[str, Any] = {"params": dict(sorted(self.params.items()))}
        for name in ("block", "grid", "shared_mem"):
            v = getattr(self, name)
            if v is not None:
                out[name] = f"<function {getattr(v, '__qualname__', 'callable')}>" if callable(v) \
                    else (list(v) if isinstance(v, tuple) else v)
        if self.defines:
            out["defines"] = dict(sorted(self.defines.items()))
        return out

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.params.items()]
        parts += [f"-D{k}" + ("" if v is None else f"={v}") for k, v in self.defines.items()]
        for name in ("block", "shared_mem"):
            v = getattr(self, name)
            if v is not None and not callable(v):
                parts.append(f"{name}={v}")
        return ", ".join(parts) or "(defaults)"

    def resolve(self, named: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
                ) -> tuple[Any, Any, int]:
        """(grid, block, shared_mem) for one launch; `named` maps argument names to values,
        `defaults` holds the kernel's compile-time parameters this config leaves as they are."""
        m = _Meta(named, dict(defaults or {}, **self.params))
        block = _call(self.block, m, "block")
        if block is None:
            raise ArgumentError("no block size: give Config(block=...) or autotune(block=...)")
        m["block"] = block
        grid = _call(self.grid, m, "grid")
        if grid is None:
            raise ArgumentError("no grid: give Config(grid=...) or autotune(grid=lambda m: ...)")
        shared = _call(self.shared_mem, m, "shared_mem") or 0
        return grid, block, shared

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(json.dumps(self.describe(), sort_keys=True))

    def __repr__(self) -> str:
        return f"Config({self.label()})"


class _Meta(dict):
    """What a geometry function sees: named arguments, then the config's params (which win)."""

    def __init__(self, named: Mapping[str, Any], params: Mapping[str, Any]):
        super().__init__(named)
        self.update(params)

    def __missing__(self, key: str) -> Any:
        raise ArgumentError(f"a geometry function asked for {key!r}, which is neither a named "
                            f"argument nor a Config parameter (it has {sorted(self)})")


def _call(value: Any, m: Mapping[str, Any], what: str) -> Any:
    if not callable(value):
        return value
    try:
        return value(m)
    except ArgumentError:
        raise
    except Exception as exc:
        raise ArgumentError(f"the {what} function failed: {type(exc).__name__}: {exc}") from exc


def _geometry(value: Any, what: str) -> Any:
    if value is None or callable(value):
        return value
    if isinstance(value, list):
        value = tuple(value)
    dims = value if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                      for d in dims):
        raise ArgumentError(f"Config {what} must be a positive int, a tuple of 1-3 of them, or a "
                            f"function of the arguments, got {value!r}")
    return value


def _json_value(v: Any, what: str) -> None:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return
    raise ArgumentError(f"{what} must be a str, int, float or bool (it becomes source text and "
                        f"part of the tuning key), got {type(v).__name__}")


def check_configs(configs: Any) -> list[Config]:
    if isinstance(configs, Config):
        configs = [configs]
    try:
        configs = list(configs)
    except TypeError:
        raise ArgumentError(f"configs must be a list of kjit.autotune.Config, got {type(configs).__name__}") from None
    if not configs:
        raise ArgumentError("configs is empty: give at least one kjit.autotune.Config")
    for i, c in enumerate(configs):
        if not isinstance(c, Config):
            raise ArgumentError(f"configs[{i}] is a {type(c).__name__}, not a kjit.autotune.Config")
    seen: dict[str, int] = {}
    for i, c in enumerate(configs):
        ident = json.dumps(c.describe(), sort_keys=True)
        if ident in seen:
            raise ArgumentError(f"configs[{i}] repeats configs[{seen[ident]}] ({c.label()})")
        seen[ident] = i
    return configs


def mode(n_configs: int, env: Mapping[str, str] | None = None) -> tuple[str, int | None]:
    """("tune", None), ("off", 0) or ("fixed", index) from $KJIT_AUTOTUNE (the on and off
    words of every KJIT_* switch, tune, fixed:<index>)."""
    how, index = autotune_mode(env)
    if how == "fixed" and not 0 <= index < n_configs:
        raise AutotuneSettingError(f"{ENV_MODE}={env_text(ENV_MODE, env)!r}: the index must be "
                                   f"0..{n_configs - 1} (a position in the configs list)")
    return how, index
