"""Architecture names: the forms kjit accepts, what they mean, and how arch=None is resolved."""
from __future__ import annotations

import pytest

from kjit import arch as arch_mod
from kjit.arch import Arch, parse, resolve
from kjit.compiler.targets import check_supported, nvrtc_supported
from kjit.errors import InvalidOptionError


@pytest.mark.parametrize("text, name, number, suffix, virtual", [
    ("sm_90", "sm_90", 90, "", False),
    (" SM_90 ", "sm_90", 90, "", False),
    ("sm_90a", "sm_90a", 90, "a", False),
    ("sm_100f", "sm_100f", 100, "f", False),
    ("sm_120", "sm_120", 120, "", False),
    ("compute_90", "compute_90", 90, "", True),
    ("compute_100a", "compute_100a", 100, "a", True),
    (90, "sm_90", 90, "", False),
    (120, "sm_120", 120, "", False),
])
def test_parse_cuda_forms(text, name, number, suffix, virtual):
    a = parse(text)
    assert (a.name, a.backend, a.number, a.suffix, a.virtual) == (name, "cuda", number, suffix, virtual)
    assert str(a) == name


def test_real_and_virtual_spellings():
    a = parse("sm_90a")
    assert (a.sm, a.compute) == ("sm_90a", "compute_90a")
    v = parse("compute_90")
    assert (v.sm, v.compute) == ("sm_90", "compute_90")


def test_parse_returns_an_arch_unchanged():
    a = parse("sm_86")
    assert parse(a) is a


@pytest.mark.parametrize("text", ["gfx90a", "gfx942", "gfx1100", "gfx90a:xnack+",
                                  "gfx90a:sramecc-:xnack+", "GFX942"])
def test_parse_hip_forms(text):
    a = parse(text, "hip")
    assert a.backend == "hip" and a.name == text.lower() and not a.virtual


@pytest.mark.parametrize("bad, words", [
    ("sm_9", ["sm_XY"]), ("sm_1000", ["sm_XY"]), ("ampere", ["sm_XY", "'sm_90'"]),
    ("90", ["sm_XY"]), (8, ["arch 8 ", "sm_XY"]),
    ("sm_89a", ["from sm_90", "sm_89"]),        # arch-specific targets start at Hopper
    ("sm_90f", ["from sm_100", "sm_90"]),       # family targets start at Blackwell
    ("gfx90a", ["backend='hip'"]),              # an AMD name on the CUDA backend
    (True, ["string"]), (9.0, ["string"]), ((9, 0), ["string"]), (None, ["string"]),
])
def test_parse_rejects_with_a_helpful_message(bad, words):
    with pytest.raises(InvalidOptionError) as info:
        parse(bad)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("bad", ["sm_90", "gfx", "gfx90a:xnack", "gfx90a:foo+"])
def test_parse_rejects_non_amd_names_for_hip(bad):
    with pytest.raises(InvalidOptionError, match="gfx"):
        parse(bad, "hip")


def test_nvrtc_supported_is_the_installed_list():
    archs = nvrtc_supported()
    assert 90 in archs and all(isinstance(n, int) for n in archs)
    assert list(archs) == sorted(archs)


def test_check_supported_lists_what_nvrtc_can_target():
    check_supported(parse("sm_90"))
    check_supported(parse("sm_90a"))
    with pytest.raises(InvalidOptionError) as info:
        check_supported(parse("sm_91"))
    msg = str(info.value)
    assert "sm_91" in msg
    for n in nvrtc_supported():
        assert f"sm_{n}" in msg


def test_check_supported_ignores_hip():
    check_supported(parse("gfx90a", "hip"))  # hiprtc decides what it can target


# --- resolve: explicit arch, else the device, else $KJIT_ARCH, else an error -------------

@pytest.fixture
def device(monkeypatch):
    """Pretend the current device is the given arch (None: no GPU)."""
    def set_device(name):
        monkeypatch.setattr(arch_mod, "device_arch",
                            lambda ordinal=None: None if name is None else parse(name))
    return set_device


def test_resolve_explicit_arch_wins(device, monkeypatch):
    device("sm_80")
    monkeypatch.setenv("KJIT_ARCH", "sm_86")
    assert resolve("sm_90").name == "sm_90"


def test_resolve_device_beats_environment(device, monkeypatch):
    device("sm_80")
    monkeypatch.setenv("KJIT_ARCH", "sm_86")
    assert resolve(None).name == "sm_80"


def test_resolve_environment_when_no_device(device, monkeypatch):
    device(None)
    monkeypatch.setenv("KJIT_ARCH", "sm_86")
    assert resolve(None).name == "sm_86"


def test_resolve_without_device_or_environment_says_how_to_choose(device):
    device(None)
    with pytest.raises(InvalidOptionError) as info:
        resolve(None)
    msg = str(info.value)
    assert "arch='sm_90'" in msg and "--arch" in msg and "KJIT_ARCH" in msg


def test_resolve_bad_environment_value_names_the_variable(device, monkeypatch):
    device(None)
    monkeypatch.setenv("KJIT_ARCH", "hopper")
    with pytest.raises(InvalidOptionError, match=r"\$KJIT_ARCH='hopper'"):
        resolve(None)


def test_resolve_hip_ignores_the_cuda_device(device, monkeypatch):
    device("sm_80")
    monkeypatch.setenv("KJIT_ARCH", "gfx942")
    assert resolve(None, "hip") == Arch("gfx942", "hip")
    monkeypatch.delenv("KJIT_ARCH")
    with pytest.raises(InvalidOptionError, match="gfx90a"):
        resolve(None, "hip")


def test_resolve_on_this_machine_without_a_gpu(monkeypatch):
    from kjit import driver
    if driver.available():
        pytest.skip("a CUDA device is present; see test_resolve_uses_the_device")
    with pytest.raises(InvalidOptionError, match="KJIT_ARCH"):
        resolve(None)


@pytest.mark.gpu
def test_resolve_uses_the_device(monkeypatch):
    from kjit import driver
    monkeypatch.setenv("KJIT_ARCH", "sm_75")  # the device must win over the environment
    major, minor = driver.compute_capability(driver.current_device())
    assert resolve(None).name == f"sm_{major}{minor}"


def test_supported_archs_are_what_the_compile_accepts():
    import kjit
    archs = kjit.supported_archs()
    assert archs and all(a.startswith("sm_") for a in archs)
    for name in archs:
        check_supported(parse(name))   # each one compiles...
    unlisted = next(f"sm_{n}" for n in (37, 50, 52, 61) if f"sm_{n}" not in archs)
    with pytest.raises(InvalidOptionError, match=", ".join(archs)):
        check_supported(parse(unlisted))   # ...and the refusal lists the same ones
    with pytest.raises(InvalidOptionError, match="'cuda' or 'hip'"):
        kjit.supported_archs("opencl")


def test_an_arch_of_the_other_backend_is_refused_before_compiling():
    import kjit
    with pytest.raises(InvalidOptionError, match="HIP target.*backend='hip'"):
        kjit.compile('extern "C" __global__ void k() {}', arch=Arch("gfx90a", "hip"))
    with pytest.raises(InvalidOptionError, match="CUDA target.*backend='cuda'"):
        parse(Arch("sm_90", "cuda"), "hip")
