"""kjit's settings: every KJIT_* environment variable is read here and nowhere else, in the
forms people write them ('512M', '7d', 'on'), and checked with an error that names the
variable, what it holds and what is accepted (docs/environment.md describes each one).

The readers take the value from os.environ unless given another mapping (a configuration
checked before it is set), and treat unset, empty and blank alike: the default.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Callable, Mapping

from .errors import ArgumentError, InvalidOptionError


class SettingError(InvalidOptionError):
    """A KJIT_* environment variable holds a value kjit cannot use (the CLI: exit 2)."""


class AutotuneSettingError(SettingError, ArgumentError):
    """A KJIT_AUTOTUNE kjit cannot use: an ArgumentError too, like @kjit.autotune's other misuses."""


# --- the forms --------------------------------------------------------------------------------
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SWITCH_FORM = "use 1, true, yes or on to turn it on, 0, false, no or off to turn it off"

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}
_MAX_SIZE = 1 << 62   # beyond any disk; keeps SQLite's integers and float conversions exact
_MAX_DIGITS = 18      # a whole number setting: beyond any count kjit could use, below int()'s limit
_SHOWN = 400          # characters of a value an error message repeats
# What the system opens (Linux PATH_MAX and NAME_MAX, the common bound elsewhere): a longer
# directory is refused by name here, not met as ENAMETOOLONG deep inside the cache.
PATH_MAX, NAME_MAX = 4096, 255


def shown(text: object) -> str:
    """A value as an error message repeats it: repr, cut short with its length when long."""
    text = str(text)
    if len(text) <= _SHOWN:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def parse_size(text: str | int) -> int:
    """'1G', '512MiB', '1048576' -> bytes; ValueError names the accepted forms."""
    if isinstance(text, int) and not isinstance(text, bool):
        if not 0 <= text <= _MAX_SIZE:
            raise ValueError(f"size {shown(text)} is not a size from 0 to 4 EiB")
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"size {shown(text)} is not a size: use bytes or a number with K, M, G or T (e.g. 512M)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value <= _MAX_SIZE:   # also inf from a thousand digits
        raise ValueError(f"size {shown(text)} is larger than any disk (at most 4 EiB)")
    return int(value)


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
                raise ValueError(f"{shown(text)} is not a duration: use e.g. 500ms, 90s, 30m, 12h, 7d, 2w")
            value = float(m.group(1)) * _SECONDS[m.group(2) or "s"]
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{shown(text)} is not a finite duration")
        if value < 0:
            raise ValueError(f"{shown(text)} is not a duration of zero or more")
    except (ValueError, OverflowError):
        if name is None:
            raise
        raise SettingError(f"{name}={shown(text)} is not a duration of zero or more, such as 500ms, "
                           "2s, 15m, 12h, 7d") from None
    if most is not None and not value <= most:
        raise SettingError(f"{name}={shown(text)} is not a duration of at most {_human_s(most)}")
    return value


def _human_s(s: float) -> str:
    return f"{s / 86400:g}d" if s >= 86400 else f"{s / 3600:g}h" if s >= 3600 else f"{s:g}s"


def switch(text: str | None, default: bool) -> bool | None:
    """A switch's value as written: `default` when unset or blank, None when it is neither
    on (1, true, yes, on) nor off (0, false, no, off)."""
    value = (text or "").strip().lower()
    if not value:
        return default
    return True if value in ON else False if value in OFF else None


# --- the readers ------------------------------------------------------------------------------
def env_raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable exactly as set (None when unset): for values whose spaces count (a
    signing key, a list of directories)."""
    return (os.environ if env is None else env).get(name)


def env_text(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable without surrounding blanks; None when unset, empty or blank."""
    value = (env_raw(name, env) or "").strip()
    return value or None


def env_switch(name: str, default: bool | None = None, env: Mapping[str, str] | None = None) -> bool:
    """A switch: on (1, true, yes, on), off (0, false, no, off), any case; unset: its default."""
    on = switch(env_raw(name, env), SWITCHES[name] if default is None else default)
    if on is None:
        raise SettingError(f"{name}={shown(env_raw(name, env))} is not a switch: {_SWITCH_FORM}")
    return on


def switch_on(name: str) -> bool:
    """A switch's value, its default from SWITCHES (KJIT_CACHE, KJIT_OBSERVE...)."""
    return env_switch(name)


def env_size(name: str, default: int, env: Mapping[str, str] | None = None) -> int:
    """A size: bytes, or a number with K, M, G or T."""
    text = env_text(name, env)
    if text is None:
        return default
    try:
        return parse_size(text)
    except ValueError as exc:
        raise SettingError(f"{name}={shown(text)} is not usable: {exc}") from None


def env_duration(name: str, default: float, *, most: float | None = None, above_zero: bool = False,
                 env: Mapping[str, str] | None = None) -> float:
    """A duration in seconds: seconds, or a number with ms, s, m, h, d or w; finite."""
    text = env_text(name, env)
    if text is None:
        return default
    value = parse_duration(text, name, most)
    if above_zero and value == 0:
        raise SettingError(f"{name}={shown(text)} is not a duration above zero")
    return value


def env_int(name: str, default: int | None, *, least: int = 1, what: str = "a whole number",
            env: Mapping[str, str] | None = None) -> int | None:
    """A whole number (digits only), at least `least`."""
    text = env_text(name, env)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]+", text) or len(text.lstrip("0")) <= _MAX_DIGITS and int(text) < least:
        raise SettingError(f"{name}={shown(text)} is not {what}: give a whole number, at least {least}")
    if len(text.lstrip("0")) > _MAX_DIGITS:
        raise SettingError(f"{name}={shown(text)} is larger than any {what[2:] if what.startswith('a ') else what} "
                           f"kjit can use: give a whole number of at most {_MAX_DIGITS} digits")
    return int(text)


def env_choice(name: str, choices: Mapping[str, str], env: Mapping[str, str] | None = None) -> str | None:
    """One of `choices` (any case; value -> what it does), or None when unset."""
    text = env_text(name, env)
    if text is None:
        return None
    if text.lower() not in choices:
        ways = "; ".join(f"{value} ({means})" for value, means in choices.items())
        raise SettingError(f"{name}={shown(text)} is not one of: {ways}; or unset it for the default")
    return text.lower()


# --- the variables ----------------------------------------------------------------------------
SWITCHES = {"KJIT_CACHE": True, "KJIT_CACHE_SAVE_SOURCE": False, "KJIT_DEBUG_SOURCES": True,
            "KJIT_HEADER_WATCH": True,
            "KJIT_OBSERVE": True, "KJIT_PCH": True, "KJIT_REMOTE_CACHE_UNSIGNED": False,
            "KJIT_TORCH_READER": True}
ENV_CACHE = "KJIT_CACHE"
ENV_SIZE, DEFAULT_SIZE = "KJIT_CACHE_SIZE", 1 << 30
ENV_MEMORY, DEFAULT_MEMORY = "KJIT_CACHE_MEMORY_SIZE", 256 << 20
ENV_JOBS = "KJIT_COMPILE_JOBS"
ENV_POOL_IDLE, DEFAULT_POOL_IDLE, MAX_POOL_IDLE = "KJIT_COMPILE_POOL_IDLE", 30.0, 7 * 86400.0
ENV_LAUNCH = "KJIT_LAUNCH"
ENV_TORCH_READER = "KJIT_TORCH_READER"
LAUNCH_CHOICES = {"bindings": "launch through cuda.bindings' cuLaunchKernel"}
ENV_AUTOTUNE = "KJIT_AUTOTUNE"
ENV_CACHE_DIR = "KJIT_CACHE_DIR"
_AUTOTUNE_FORM = ("on, 1, true, yes or tune (time the configurations, the default); off, 0, false "
                  "or no (the first configuration, no timing); fixed:<index>")


def cache_enabled() -> bool:
    """$KJIT_CACHE: whether any cache is read or written."""
    return env_switch(ENV_CACHE)


def size_limit() -> int:
    """$KJIT_CACHE_SIZE in bytes."""
    return env_size(ENV_SIZE, DEFAULT_SIZE)


def memory_limit() -> int:
    """$KJIT_CACHE_MEMORY_SIZE in bytes."""
    return env_size(ENV_MEMORY, DEFAULT_MEMORY)


def compile_jobs() -> int | None:
    """$KJIT_COMPILE_JOBS, None when unset (every core)."""
    return env_int(ENV_JOBS, None, what="a number of compile workers")


def pool_idle() -> float:
    """$KJIT_COMPILE_POOL_IDLE in seconds."""
    return env_duration(ENV_POOL_IDLE, DEFAULT_POOL_IDLE, most=MAX_POOL_IDLE)


def launch_mode() -> str | None:
    """$KJIT_LAUNCH: "bindings", or None (the C launch call where it is built)."""
    return env_choice(ENV_LAUNCH, LAUNCH_CHOICES)


def autotune_mode(env: Mapping[str, str] | None = None) -> tuple[str, int | None]:
    """$KJIT_AUTOTUNE as ("tune", None), ("off", 0) or ("fixed", index); whether the index
    is in range is the tuner's question."""
    text = env_text(ENV_AUTOTUNE, env)
    word = (text or "").lower()
    if word in ("", "tune", *ON):
        return "tune", None
    if word in OFF:
        return "off", 0
    if (word.startswith("fixed:") and re.fullmatch(r"[0-9]+", word[6:].strip())
            and len(word[6:].strip().lstrip("0")) <= _MAX_DIGITS):
        return "fixed", int(word[6:])
    raise AutotuneSettingError(f"{ENV_AUTOTUNE}={shown(text)} is not one of: {_AUTOTUNE_FORM}")


def cache_dir_paths(env: Mapping[str, str] | None = None) -> None:
    """$KJIT_CACHE_DIR: SettingError for a listed directory no system call could open (a
    path over PATH_MAX bytes or a name in it over NAME_MAX); where it lives, and whether it
    can be used, is kjit.locations' and the cache's question."""
    for part in (env_raw(ENV_CACHE_DIR, env) or "").split(os.pathsep):
        if not part.strip():
            continue
        raw = os.fsencode(os.path.expanduser(part))
        longest = max(raw.split(b"/"), key=len)
        if len(raw) >= PATH_MAX or len(longest) > NAME_MAX:
            what = (f"is {len(raw)} bytes long, more than any path the system opens ({PATH_MAX - 1})"
                    if len(raw) >= PATH_MAX else
                    f"has a name of {len(longest)} bytes, more than any file system allows ({NAME_MAX})")
            raise SettingError(f"{ENV_CACHE_DIR}: the directory {shown(part)} {what}: set it to "
                               "the cache directory's path, or unset it for the default")


ENV_REMOTE_URL = "KJIT_REMOTE_CACHE"
ENV_REMOTE_BACKEND = "KJIT_REMOTE_CACHE_BACKEND"   # package.module:Class serving the URL
_REMOTE = (ENV_REMOTE_URL, ENV_REMOTE_BACKEND, "KJIT_REMOTE_CACHE_KEY", "KJIT_REMOTE_CACHE_KEY_FILE",
           "KJIT_REMOTE_CACHE_PREFIX", "KJIT_REMOTE_CACHE_TTL", "KJIT_REMOTE_CACHE_MAX_VALUE",
           "KJIT_REMOTE_CACHE_TIMEOUT", "KJIT_REMOTE_CACHE_BACKOFF", "KJIT_REMOTE_CACHE_LEASE",
           "KJIT_REMOTE_CACHE_WAIT", "KJIT_REMOTE_CACHE_UNSIGNED")

# Every KJIT_* variable -> its check here, or None where it is checked where it is read,
# because its form is another module's question: an architecture name (kjit.arch), a file
# (kjit.linker.devrt), the shared tier's URL, backend, key and limits (kjit.cache.remote and
# kjit.cache.registry, when the tier is configured: unused without KJIT_REMOTE_CACHE), a list of directories
# (kjit.locations; check_settings refuses only a path no system could open).
VARIABLES: dict[str, Callable[[], object] | None] = {
    **{name: functools.partial(env_switch, name) for name in SWITCHES},
    ENV_SIZE: size_limit,
    ENV_MEMORY: memory_limit,
    ENV_JOBS: compile_jobs,
    ENV_POOL_IDLE: pool_idle,
    ENV_LAUNCH: launch_mode,
    ENV_AUTOTUNE: autotune_mode,
    "KJIT_ARCH": None,
    "KJIT_CUDADEVRT": None,
    ENV_CACHE_DIR: None,
    **dict.fromkeys(_REMOTE),
}


def check_settings() -> None:
    """SettingError for the first setting kjit cannot use, naming the variable and the
    accepted forms. Run when a process first uses its cache, hit or miss alike, so that a
    typo is never ignored on one path and fatal on the other."""
    for check in VARIABLES.values():
        if check is not None:
            check()
    cache_dir_paths()
