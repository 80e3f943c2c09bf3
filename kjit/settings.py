"""The local cache's settings: sizes and durations as people write them ('512M', '7d'), the
KJIT_* switches, and the one check that a process's settings are usable (hit or miss alike)."""
from __future__ import annotations

import os
import re

from ..errors import InvalidOptionError

ENV_SIZE = "KJIT_CACHE_SIZE"
ENV_MEMORY = "KJIT_CACHE_MEMORY_SIZE"   # the memory layer's (kjit.cache.memory)
DEFAULT_MEMORY = 256 << 20
DEFAULT_SIZE = 1 << 30

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


class SettingError(InvalidOptionError):
    """A KJIT_* environment variable holds a value kjit cannot use (the CLI: exit 2)."""


_MAX_SIZE = 1 << 62   # beyond any disk; keeps SQLite's integers and float conversions exact


def parse_size(text: str | int) -> int:
    """'1G', '512MiB', '1048576' -> bytes; ValueError names the accepted forms."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= _MAX_SIZE:
            raise ValueError(f"size {text!r} is not a size from 0 to 4 EiB")
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {text!r} is not a size: use bytes or a number with K, M, G or T (e.g. 512M)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value <= _MAX_SIZE:   # also inf from a thousand digits
        raise ValueError(f"size {text!r} is larger than any disk (at most 4 EiB)")
    return int(value)


# Switches: KJIT_CACHE, KJIT_CACHE_SAVE_SOURCE, KJIT_HEADER_WATCH (kjit.compiler.watch),
# KJIT_OBSERVE (kjit.compiler.observe), KJIT_PCH (kjit.compiler.pch). Every KJIT_* switch is read
# through switch() or switch_on().
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SWITCHES = ("KJIT_CACHE", "KJIT_CACHE_SAVE_SOURCE", "KJIT_HEADER_WATCH", "KJIT_OBSERVE", "KJIT_PCH")


def switch(text: str | None, default: bool) -> bool | None:
    """A switch's value as written: `default` when unset or blank, None when it is neither
    on (1, true, yes, on) nor off (0, false, no, off)."""
    value = (text or "").strip().lower()
    if not value:
        return default
    return True if value in ON else False if value in OFF else None


def switch_on(name: str) -> bool:
    """A switch that is on unless set to 0, false, no or off (check_settings rejects others)."""
    return switch(os.environ.get(name), True) is not False


def check_settings() -> None:
    """SettingError for the first local cache setting kjit cannot use, naming the variable
    and the accepted forms. Run when a process first uses its cache, hit or miss alike,
    so that a typo is never ignored on one path and fatal on the other."""
    for name, default in ((ENV_SIZE, DEFAULT_SIZE), (ENV_MEMORY, DEFAULT_MEMORY)):
        env_size(name, default)
    for name in _SWITCHES:
        value = os.environ.get(name, "").strip().lower()
        if value and value not in ON + OFF:
            raise SettingError(f"{name}={os.environ[name]!r} is not a switch: use 1, true, yes "
                               "or on to turn it on, 0, false, no or off to turn it off")


def env_size(name: str, default: int) -> int:
    env = os.environ.get(name, "").strip()
    if not env:
        return default
    try:
        return parse_size(env)
    except ValueError as exc:
        raise SettingError(f"{name}={env!r} is not usable: {exc}") from None


_SECONDS = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str | float, name: str | None = None, most: float | None = None) -> float:
    """'500ms', '90s', '30m', '12h', '7d', '2w' (or seconds) -> seconds; ValueError names the
    accepted forms. With `name` (the setting it comes from), a SettingError naming it
    instead, and at most `most` seconds."""
    try:
        if isinstance(text, (int, float)):
            value = float(text)
        else:
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|[smhdw]?)\s*", str(text).lower())
            if not m:
                raise ValueError(f"{text!r} is not a duration: use e.g. 500ms, 90s, 30m, 12h, 7d, 2w")
            value = float(m.group(1)) * _SECONDS[m.group(2) or "s"]
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{text!r} is not a finite duration")
        if value < 0:
            raise ValueError(f"{text!r} is not a duration of zero or more")
    except (ValueError, OverflowError):
        if name is None:
            raise
        raise SettingError(f"{name}={text!r} is not a duration of zero or more, such as 500ms, "
                           "2s, 15m, 12h, 7d") from None
    if most is not None and not value <= most:
        raise SettingError(f"{name}={text!r} is not a duration of at most {_human_s(most)}")
    return value


def _human_s(s: float) -> str:
    return f"{s / 86400:g}d" if s >= 86400 else f"{s / 3600:g}h" if s >= 3600 else f"{s:g}s"


def size_limit() -> int:
    return env_size(ENV_SIZE, DEFAULT_SIZE)
