"""Every KJIT_* variable is read by kjit.settings: one vocabulary for on and off, durations
and sizes in one form, and a value kjit cannot use is an error naming the variable, what it
holds and what is accepted, before anything is compiled or launched."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import kjit
from kjit import settings
from kjit.compiler import pool
from kjit.errors import ArgumentError, InvalidOptionError
from kjit.settings import SettingError, check_settings

ENVIRONMENT = Path(__file__).resolve().parent.parent / "docs" / "environment.md"
SRC = 'extern "C" __global__ void k(float* y){ y[0] = 2; }'


# --- KJIT_COMPILE_POOL_IDLE: a duration ----------------------------------------------------
@pytest.mark.parametrize("value, seconds", [("30s", 30.0), ("2m", 120.0), ("1.5", 1.5), (" 45 ", 45.0),
                                            ("500ms", 0.5), ("0", 0.5), ("", 30.0)])
def test_pool_idle_is_a_duration(monkeypatch, value, seconds):
    monkeypatch.setenv("KJIT_COMPILE_POOL_IDLE", value)
    assert pool.idle_timeout() == seconds


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e3", "junk", "30 parsecs", "8d"])
def test_pool_idle_refuses_what_is_no_duration(monkeypatch, value):
    monkeypatch.setenv("KJIT_COMPILE_POOL_IDLE", value)
    with pytest.raises(SettingError, match=re.escape(f"KJIT_COMPILE_POOL_IDLE={value!r} is not a duration")):
        pool.idle_timeout()
    with pytest.raises(SettingError, match="KJIT_COMPILE_POOL_IDLE"):
        check_settings()


# --- KJIT_COMPILE_JOBS: a whole number ----------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "many", "4.0", "+4", "-2", "1_0", "٣"])
def test_compile_jobs_refuses_what_is_no_count(monkeypatch, value):
    monkeypatch.setenv("KJIT_COMPILE_JOBS", value)
    with pytest.raises(SettingError) as info:
        pool.pool_size()
    assert str(info.value).startswith(f"KJIT_COMPILE_JOBS={value!r} is not a number of compile workers")
    assert "at least 1" in str(info.value)


# --- KJIT_AUTOTUNE: the switch words, tune, fixed:<index> ---------------------------------------
@pytest.mark.parametrize("value, expected", [
    ("", ("tune", None)), ("tune", ("tune", None)), ("on", ("tune", None)), ("1", ("tune", None)),
    ("true", ("tune", None)), ("YES", ("tune", None)), ("True", ("tune", None)),
    ("off", ("off", 0)), ("0", ("off", 0)), ("false", ("off", 0)), ("no", ("off", 0)), ("OFF", ("off", 0)),
    ("fixed:2", ("fixed", 2)), ("Fixed:0", ("fixed", 0)),
])
def test_autotune_takes_the_words_every_switch_takes(monkeypatch, value, expected):
    from kjit.tune.config import mode
    monkeypatch.setenv("KJIT_AUTOTUNE", value)
    assert mode(4) == expected
    check_settings()


@pytest.mark.parametrize("value", ["fastest", "fixed:", "fixed:x", "fixed:-1", "2"])
def test_a_bad_autotune_names_the_variable_and_the_words(monkeypatch, value):
    from kjit.tune.config import mode
    monkeypatch.setenv("KJIT_AUTOTUNE", value)
    with pytest.raises(SettingError) as info:
        mode(4)
    assert isinstance(info.value, ArgumentError)   # as every misuse of @kjit.autotune
    assert str(info.value).startswith(f"KJIT_AUTOTUNE={value!r} is not one of")
    assert all(w in str(info.value) for w in ("on", "true", "off", "false", "fixed:<index>"))


# --- KJIT_LAUNCH: bindings or unset -------------------------------------------------------------
def test_launch_bindings_in_any_case(monkeypatch):
    from kjit.runtime.kernel import c_launch
    for value in ("bindings", "Bindings", " BINDINGS "):
        monkeypatch.setenv("KJIT_LAUNCH", value)
        assert c_launch() is None


@pytest.mark.parametrize("value", ["bindingz", "c", "1", "off"])
def test_a_launch_mode_kjit_does_not_know_is_refused(monkeypatch, value):
    from kjit.runtime.kernel import c_launch
    monkeypatch.setenv("KJIT_LAUNCH", value)
    with pytest.raises(SettingError) as info:
        c_launch()   # called when a Kernel is made, before any launch
    assert str(info.value).startswith(f"KJIT_LAUNCH={value!r} is not one of: bindings")
    with pytest.raises(SettingError, match="KJIT_LAUNCH"):
        check_settings()


# --- one vocabulary for every switch ------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(settings.SWITCHES))
def test_every_switch_takes_the_same_words(monkeypatch, name):
    for word, on in [("1", True), ("true", True), ("Yes", True), ("ON", True),
                     ("0", False), ("false", False), ("no", False), ("Off", False)]:
        monkeypatch.setenv(name, word)
        assert settings.env_switch(name) is on, word
    monkeypatch.setenv(name, "")
    assert settings.env_switch(name) is settings.SWITCHES[name]
    monkeypatch.setenv(name, "enabled")
    with pytest.raises(SettingError, match=re.escape(f"{name}='enabled' is not a switch: use 1, true")):
        settings.env_switch(name)


# --- KJIT_ARCH: one reader, one error, for compile and link alike -------------------------------
def test_a_bad_arch_variable_is_the_same_error_for_link(monkeypatch):
    from kjit import driver
    from kjit.linker import link
    if driver.available():
        pytest.skip("a GPU is present: the device's arch is used, not $KJIT_ARCH")
    rdc = kjit.CompileOptions(relocatable=True)
    lib = kjit.compile('extern "C" __device__ float twice(float x) { return 2 * x; }', arch="sm_90",
                       target="ptx", options=rdc)
    monkeypatch.setenv("KJIT_ARCH", "hopper")
    for call in (lambda: kjit.compile(SRC), lambda: link([lib])):
        with pytest.raises(SettingError, match=r"^\$KJIT_ARCH='hopper' is not usable"):
            call()


def test_the_device_runtime_variable_is_read_once(monkeypatch, tmp_path):
    from kjit.errors import LinkError
    from kjit.linker import devrt
    monkeypatch.setenv("KJIT_CUDADEVRT", f" {tmp_path / 'none.a'} ")
    assert devrt.candidates()[0] == tmp_path / "none.a"
    with pytest.raises(LinkError, match=re.escape(f"KJIT_CUDADEVRT={tmp_path / 'none.a'} does not name a file")):
        devrt.find(13)


# --- the list of variables ----------------------------------------------------------------------
def test_settings_knows_every_variable_on_the_environment_page():
    listed = {m for line in ENVIRONMENT.read_text().splitlines() if line.startswith("#")
              for m in re.findall(r"\bKJIT_[A-Z0-9_]*[A-Z0-9]", line)}
    assert set(settings.VARIABLES) == listed


@pytest.mark.parametrize("name", sorted(n for n, check in settings.VARIABLES.items() if check))
def test_check_settings_names_each_variable_it_checks(monkeypatch, name):
    monkeypatch.setenv(name, "no such value!")
    with pytest.raises(SettingError) as info:
        check_settings()
    assert str(info.value).startswith(f"{name}='no such value!' is not")


def test_a_bad_setting_stops_a_compile_hit_or_miss(monkeypatch):
    kjit.compile(SRC, arch="sm_90")
    from kjit.cache import lookup
    for name, value in [("KJIT_LAUNCH", "bindingz"), ("KJIT_COMPILE_POOL_IDLE", "nan"),
                        ("KJIT_AUTOTUNE", "fastest")]:
        monkeypatch.setenv(name, value)
        for src in (SRC, SRC + "// a miss " + name):
            monkeypatch.setattr(lookup, "_caches", {})   # as a fresh process sees it
            with pytest.raises(SettingError, match=re.escape(f"{name}={value!r}")):
                kjit.compile(src, arch="sm_90")
        monkeypatch.delenv(name)


@pytest.mark.parametrize("name, value", [("KJIT_LAUNCH", "bindingz"), ("KJIT_COMPILE_POOL_IDLE", "30 parsecs"),
                                         ("KJIT_AUTOTUNE", "yes please")])
def test_the_command_line_exits_2_naming_the_variable(tmp_path, monkeypatch, name, value):
    from kjit.cli.main import cli
    src = tmp_path / "k.cu"
    src.write_text(SRC)
    monkeypatch.setenv(name, value)
    res = CliRunner().invoke(cli, ["compile", str(src), "--arch", "sm_90", "--json"])
    assert res.exit_code == 2, res.output
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "UsageError" and f"{name}={value!r}" in err["message"]


def test_a_setting_error_is_an_invalid_option_error():
    assert issubclass(SettingError, InvalidOptionError)
