"""The shared tier's settings: trusting an unsigned server is an explicit choice, an empty
signing key is an error naming its variable, and no value of any variable crashes kjit (a
clear error naming the variable, or a working configuration)."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

import kjit.cache
from kjit.cache import CacheWarning, remote, shared
from kjit.errors import InvalidOptionError, KjitError
from kjit.objectcode import ObjectCode
from redis_server import require_redis

NS = "settings-test"


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    for name in remote.ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "node"))
    yield
    if shared._active is not None:
        shared._active.close()


def lookup(tag: str) -> ObjectCode:
    text = f".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry {tag}()\n{{\nret;\n}}\n"
    return kjit.cache.get_or_create(NS, {"tag": tag}, lambda: ObjectCode(text.encode(), kind="ptx", name=tag))


def run_cli(*args):
    from kjit.cli.main import cli
    return CliRunner().invoke(cli, list(args))


# --- an unsigned tier is a choice ----------------------------------------------------------------
def test_a_tier_without_a_key_is_off_unless_trusted_unsigned(redis_server, monkeypatch):
    monkeypatch.setenv(remote.ENV_URL, redis_server.url)
    r = redis_server.client()
    with pytest.warns(CacheWarning) as caught:
        assert lookup("unsigned").cache_hit is False
    message = " ".join(str(w.message) for w in caught)
    for var in (remote.ENV_KEY_FILE, remote.ENV_KEY, remote.ENV_UNSIGNED):
        assert var in message
    assert r.keys("*") == [], "an untrusted unsigned tier was written to"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per setting, not per lookup
        lookup("unsigned-2")
    res = run_cli("cache", "ls", "--remote")
    assert res.exit_code == 1 and remote.ENV_UNSIGNED in res.output
    from kjit.cache import describe_remote
    from kjit.cli.info import _remote_text
    info = describe_remote()
    assert info["off"] and remote.ENV_UNSIGNED in _remote_text(info)
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")  # the explicit choice
    monkeypatch.setenv("KJIT_CACHE_DIR", str(redis_server.directory / "node-b"))
    lookup("unsigned-3")
    assert len(r.keys("*")) == 1


def test_configure_without_a_key_needs_unsigned(redis_server, monkeypatch):
    monkeypatch.delenv(remote.ENV_UNSIGNED, raising=False)
    cfg = kjit.cache.configure_remote(redis_server.url)
    assert cfg.refusal and remote.ENV_UNSIGNED in cfg.refusal
    cfg = kjit.cache.configure_remote(redis_server.url, unsigned=True)
    assert cfg.refusal is None and cfg.unsigned_ok
    assert shared.active() is not None
    kjit.cache.configure_remote(None)


def test_a_bad_unsigned_value_is_an_error(monkeypatch):
    monkeypatch.setenv(remote.ENV_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(remote.ENV_UNSIGNED, "maybe")
    with pytest.raises(InvalidOptionError, match=remote.ENV_UNSIGNED):
        lookup("maybe")


# --- an empty key is no key -----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_an_empty_signing_key_is_an_error_naming_it(monkeypatch, value):
    monkeypatch.setenv(remote.ENV_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")  # even where unsigned would be allowed
    monkeypatch.setenv(remote.ENV_KEY, value)
    created = []
    with pytest.raises(InvalidOptionError, match=remote.ENV_KEY):
        kjit.cache.get_or_create(NS, {"tag": "empty"}, lambda: created.append(1))
    assert created == [], "compiled before the bad setting was reported"


@pytest.mark.parametrize("content", [b"", b"   \n", b"\n\n"])
def test_an_empty_key_file_is_an_error_naming_it(monkeypatch, tmp_path, content):
    key_file = tmp_path / "key"
    key_file.write_bytes(content)
    monkeypatch.setenv(remote.ENV_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(remote.ENV_KEY_FILE, str(key_file))
    with pytest.raises(InvalidOptionError, match=remote.ENV_KEY_FILE):
        lookup("empty-file")
    monkeypatch.setenv(remote.ENV_KEY_FILE, "")
    with pytest.raises(InvalidOptionError, match=remote.ENV_KEY_FILE):
        lookup("empty-path")


def test_kjit_compile_with_an_empty_key_fails_clearly(monkeypatch, tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k() {}\n')
    monkeypatch.setenv(remote.ENV_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(remote.ENV_KEY, "  ")
    res = run_cli("compile", str(src), "--arch", "sm_90", "--json")
    assert res.exit_code not in (0, 70), (res.exit_code, res.output)
    assert remote.ENV_KEY in res.output and "Traceback" not in res.output
    assert isinstance(json.loads(res.output), dict)  # one JSON object, saying what is wrong


# --- no setting crashes kjit --------------------------------------------------------------------
@pytest.mark.parametrize("var, value, words", [
    (remote.ENV_TIMEOUT, "99999999999999999999999d", "at most"),
    (remote.ENV_TTL, "1" + "0" * 400 + "s", "duration"),
    (remote.ENV_WAIT, "30w", "at most"),
    (remote.ENV_MAX_VALUE, "9" * 400 + "T", "size"),
    (remote.ENV_URL, "redis://[::1:6379/0", "redis://"),
    (remote.ENV_URL, "redis://host:99999/0", "redis://"),
    (remote.ENV_URL, "redis://host:port/0", "redis://"),
    (remote.ENV_URL, "unix://", "socket"),
    (remote.ENV_URL, "http://cache:6379", "redis://"),
    (remote.ENV_TTL, "a week", "duration"),
    (remote.ENV_MAX_VALUE, "lots", "size"),
    (remote.ENV_PREFIX, "kjit *", "prefix"),
    (remote.ENV_TIMEOUT, "0", "above zero"),
])
def test_a_malformed_setting_names_the_variable_and_the_form(monkeypatch, var, value, words):
    monkeypatch.setenv(remote.ENV_URL, "redis://127.0.0.1:1/0")
    monkeypatch.setenv(remote.ENV_UNSIGNED, "1")
    monkeypatch.setenv(var, value)
    with pytest.raises(InvalidOptionError, match=var) as info:
        lookup("bad")
    assert words in str(info.value)
    for command in (["stats", "--remote"], ["ls", "--remote"], ["clear", "--remote", "--yes"]):
        res = run_cli("cache", *command, "--json")
        assert res.exit_code not in (0, 70) and var in res.output, (command, res.exit_code, res.output)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
_DURATIONISH = st.one_of(_TEXT, st.from_regex(r"\s*[0-9]{1,30}(\.[0-9]{1,5})?\s*(ms|s|m|h|d|w|)\s*",
                                              fullmatch=True))
_URLISH = st.one_of(
    _TEXT, st.builds(lambda s, rest: s + rest, st.sampled_from(["redis://", "rediss://", "unix://"]), _TEXT),
    st.from_regex(r"redis://(\w+(:\w*)?@)?(\[[0-9a-f:]{0,12}\]?|[a-z0-9.]{0,12})(:[0-9a-z]{0,7})?(/[0-9a-z]{0,4})?"
                  r"(\?[a-z_]{0,12}=[0-9a-z]{0,5})?", fullmatch=True))


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(var=st.sampled_from([remote.ENV_TTL, remote.ENV_TIMEOUT, remote.ENV_BACKOFF, remote.ENV_LEASE,
                            remote.ENV_WAIT, remote.ENV_MAX_VALUE, remote.ENV_PREFIX, remote.ENV_UNSIGNED,
                            remote.ENV_KEY]),
       value=_DURATIONISH)
def test_any_setting_value_is_accepted_or_named(var, value):
    env = {remote.ENV_URL: "redis://127.0.0.1:1/0", var: value}
    try:
        cfg = remote.RemoteConfig.from_env(env)
    except InvalidOptionError as exc:
        assert var in str(exc)
        return
    assert cfg is not None
    for seconds in (cfg.ttl_s, cfg.timeout_s, cfg.backoff_s, cfg.lease_s, cfg.wait_s):
        assert 0 <= seconds <= 10 * 365 * 86400
    assert 0 <= cfg.max_value <= 1 << 40


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(url=_URLISH)
def test_any_url_is_accepted_or_named(url):
    require_redis()
    try:
        cfg = remote.RemoteConfig.from_env({remote.ENV_URL: url, remote.ENV_UNSIGNED: "1"})
        if cfg is None:
            return
        cfg.display_url  # noqa: B018
        tier = shared.open_tier(cfg)
    except InvalidOptionError as exc:
        assert remote.ENV_URL in str(exc)
        return
    tier.close()


def test_a_key_that_is_not_utf8_is_used_as_its_bytes():
    env = {remote.ENV_URL: "redis://127.0.0.1:1/0", remote.ENV_KEY: "s\udcffcret"}  # os.environ's
    assert remote.RemoteConfig.from_env(env).secret == b"s\xffcret"               # undecodable byte
