"""Autotuning without a GPU: NVRTC compiles the candidates for real, a Python timer stands
in for the CUDA-event timing, and a fixed device identity for the current device's."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import kjit
from kjit import ArgumentError, KjitError

Config = kjit.autotune.Config
DEVICE = {"name": "Test GPU", "sms": 132, "cc": "9.0", "driver": 13000}


def scale_source(BS=128, UNROLL=1):
    return f'''
extern "C" __global__ void scale(float* x, float a, int n) {{
    static_assert({BS} <= 1024, "a block has at most 1024 threads");
    int i = (blockIdx.x * {BS} + threadIdx.x) * {UNROLL};
    #pragma unroll
    for (int u = 0; u < {UNROLL}; ++u) if (i + u < n) x[i + u] *= a;
}}'''


class FakeTimer:
    """ms per config from a table (a pure function of the config), counting calls."""

    def __init__(self, table=None):
        self.table = table or {}
        self.calls: list[dict] = []

    def __call__(self, candidate):
        assert candidate.object is not None and candidate.object.kind == "cubin"  # compiled for real
        self.calls.append(dict(candidate.config.params))
        return self.table.get(candidate.config.params["BS"], 1.0 + candidate.config.params["BS"] / 1000)


def make(configs, timer, key=("n",), **kw):
    @kjit.autotune(configs=configs, key=list(key), timer=timer, device=DEVICE,
                   block=lambda m: m["BS"], grid=lambda m: kjit.cdiv(m["n"], m["BS"] * m["UNROLL"]), **kw)
    @kjit.kernel(arch="sm_90")
    def scale(BS=128, UNROLL=1):
        return scale_source(BS, UNROLL)
    return scale


CONFIGS = [Config(BS=64), Config(BS=128), Config(BS=256), Config(BS=128, UNROLL=4)]


def test_tuning_times_every_config_and_picks_the_fastest():
    timer = FakeTimer({64: 3.0, 128: 2.0, 256: 0.5})
    f = make(CONFIGS[:3], timer)
    r = f.tune(None, 2.0, 10000)
    assert r.config.params == dict(BS=256) and r.ms == 0.5 and r.measured == 3
    assert sorted(c["BS"] for c in timer.calls) == [64, 128, 256]
    assert r.candidate.geometry({"x": None, "a": 2.0, "n": 10000}) == (40, 256, 0)
    # the same key in this process: remembered, not timed again
    assert f.best_config(None, 3.0, 10000).params == dict(BS=256) and len(timer.calls) == 3


def test_key_values_select_entries_and_other_arguments_do_not():
    timer = FakeTimer()
    f = make(CONFIGS[:2], timer)
    f.tune(None, 2.0, 1000)
    f.tune(None, 5.0, 1000)          # a is not in the key
    assert len(timer.calls) == 2
    f.tune(None, 2.0, 2000)          # n is
    assert len(timer.calls) == 4


def test_arrays_are_keyed_by_dtype_and_shape():
    from kjit.tune.keys import key_value
    class Arr:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype
    assert key_value("x", Arr((4, 8), "float32")) == {"shape": [4, 8], "dtype": "float32"}
    assert key_value("x", Arr((4, 8), "float32")) != key_value("x", Arr((4, 8), "float16"))
    class KjitLike(Arr):   # a kjit array: its typestr, so that numpy is not needed
        typestr = "<f4"
    assert key_value("x", KjitLike((4, 8), None)) == key_value("x", Arr((4, 8), "float32"))
    with pytest.raises(ArgumentError, match="'s' is a object"):
        key_value("s", object())


def test_a_second_tuner_reads_the_stored_timings():
    make(CONFIGS[:3], FakeTimer({256: 0.5})).tune(None, 2.0, 4096)
    again = FakeTimer()
    r = make(CONFIGS[:3], again).tune(None, 2.0, 4096)
    assert again.calls == [] and r.measured == 0 and r.config.params == dict(BS=256)


def test_adding_a_config_times_only_that_one():
    make(CONFIGS[:3], FakeTimer()).tune(None, 2.0, 4096)
    timer = FakeTimer({128: 0.1})
    r = make(CONFIGS, timer).tune(None, 2.0, 4096)
    assert timer.calls == [{"BS": 128, "UNROLL": 4}]
    assert r.config.params == dict(BS=128, UNROLL=4) and r.measured == 1


def test_another_device_is_tuned_again():
    make(CONFIGS[:2], FakeTimer()).tune(None, 2.0, 4096)
    timer = FakeTimer()

    @kjit.autotune(configs=CONFIGS[:2], key=["n"], timer=timer, device=dict(DEVICE, sms=114),
                   block=lambda m: m["BS"], grid=lambda m: 1)
    @kjit.kernel(arch="sm_90")
    def scale(BS=128, UNROLL=1):
        return scale_source(BS, UNROLL)
    scale.tune(None, 2.0, 4096)
    assert len(timer.calls) == 2


def test_a_config_that_does_not_compile_is_skipped_with_its_reason():
    timer = FakeTimer()
    r = make([Config(BS=2048), Config(BS=64)], timer).tune(None, 2.0, 100)
    assert r.config.params == dict(BS=64) and timer.calls == [{"BS": 64}]
    rec = r.records[0]
    assert rec["status"] == "compile_error" and "at most 1024 threads" in rec["reason"]
    # kept: a second tuning does not compile it again
    assert make([Config(BS=2048), Config(BS=64)], FakeTimer()).tune(None, 2.0, 100).records[0] == rec


def test_no_config_that_runs_is_an_error_naming_each_reason():
    with pytest.raises(KjitError, match=r"(?s)no configuration can run.*\[0\] BS=2000.*1024 threads.*\[1\] BS=4000"):
        make([Config(BS=2000), Config(BS=4000)], FakeTimer()).tune(None, 2.0, 100)


def test_a_second_process_times_nothing(tmp_path):
    script = textwrap.dedent(f'''
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        import kjit, tune_case
        timer = tune_case.FakeTimer()
        r = tune_case.make(tune_case.CONFIGS, timer).tune(None, 2.0, 777)
        print(json.dumps({{"calls": len(timer.calls), "config": r.config.params}}))
    ''')
    (tmp_path / "tune_case.py").write_text(open(__file__).read())
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                      check=True).stdout) for _ in range(2)]
    assert runs[0]["calls"] == 4 and runs[1] == dict(runs[0], calls=0)


def test_deterministic_modes(monkeypatch):
    timer = FakeTimer({64: 5.0})
    monkeypatch.setenv("KJIT_AUTOTUNE", "off")
    r = make(CONFIGS, timer).tune(None, 2.0, 4096)
    assert r.index == 0 and r.mode == "off" and timer.calls == []
    monkeypatch.setenv("KJIT_AUTOTUNE", "fixed:2")
    r = make(CONFIGS, timer).tune(None, 2.0, 4096)
    assert r.index == 2 and r.mode == "fixed" and timer.calls == []
    monkeypatch.setenv("KJIT_AUTOTUNE", "fixed:9")
    with pytest.raises(ArgumentError, match=r"KJIT_AUTOTUNE='fixed:9'.*0\.\.3"):
        make(CONFIGS, timer).tune(None, 2.0, 4096)
    monkeypatch.setenv("KJIT_AUTOTUNE", "fastest")
    with pytest.raises(ArgumentError, match="is not one of"):
        make(CONFIGS, timer).tune(None, 2.0, 4096)


@pytest.mark.parametrize("configs, words", [
    ([], "configs is empty"),
    ([Config(BS=64), Config(BS=64)], r"configs\[1\] repeats configs\[0\]"),
    ([{"BS": 64}], r"configs\[0\] is a dict"),
    ([Config(TILE=64)], r"configs set \['TILE'\], which scale does not take"),
])
def test_bad_configs_are_refused_at_decoration(configs, words):
    with pytest.raises(ArgumentError, match=words):
        make(configs, FakeTimer())


def test_decorators_in_the_wrong_order_name_the_right_one():
    """@kjit.kernel over @kjit.autotune hands autotune the bare function: the error says
    which decorator goes on top, before anything compiles."""
    with pytest.raises(ArgumentError, match=r"@kjit.autotune goes above @kjit.kernel"):
        @kjit.kernel
        @kjit.autotune(configs=[Config(BS=64)])
        def scale(BS=64):
            return 'extern "C" __global__ void scale(float* x) {}'


def test_bad_config_values():
    with pytest.raises(ArgumentError, match="block must be a positive int"):
        Config(BS=64, block=0)
    with pytest.raises(ArgumentError, match="must be a str, int, float or bool"):
        Config(BS=[64])
    with pytest.raises(ArgumentError, match="shared_mem must be a byte count"):
        Config(shared_mem=-1)


def test_bad_keys_and_arguments():
    f = make(CONFIGS[:2], FakeTimer(), key=["size"])
    with pytest.raises(ArgumentError, match="key names argument 'size'.*x, a, n"):
        f.tune(None, 2.0, 100)
    g = make(CONFIGS[:2], FakeTimer())
    with pytest.raises(ArgumentError, match="missing argument"):
        g.tune(None, 2.0)
    with pytest.raises(ArgumentError, match="has no parameter 'm'"):
        g.tune(None, 2.0, m=3)
    with pytest.raises(KjitError, match="is autotuned: call it"):
        g[1, 128]


def test_parameter_names_come_from_the_source():
    from kjit.tune.keys import parameter_names
    src = "template <int B> __global__ void k(const float* __restrict__ a, int n, float b[4]) {}"
    assert parameter_names(src, "k<64>") == ["a", "n", "b"]
    assert parameter_names(src, "other") is None


def test_tuning_hand_built_requests():
    timer = FakeTimer({64: 0.3})
    reqs = [{"source": scale_source(bs), "kernel": "scale"} for bs in (64, 128)]
    cfgs = [Config(BS=64, block=64, grid=1), Config(BS=128, block=128, grid=1)]
    r = kjit.autotune.tune(reqs, cfgs, (None, 2.0, 100), key=["n"], timer=timer, device=DEVICE,
                           arch="sm_90")
    assert r.index == 0 and len(timer.calls) == 2
    r2 = kjit.autotune.tune(lambda c: {"source": scale_source(c.params["BS"]), "kernel": "scale"},
                            cfgs, (None, 2.0, 100), key=["n"], timer=FakeTimer(), device=DEVICE, arch="sm_90")
    assert r2.measured == 0 and r2.index == 0

    @kjit.kernel(arch="sm_90")
    def scale(BS=128, UNROLL=1):
        return scale_source(BS, UNROLL)
    timer3 = FakeTimer({128: 0.1})
    r3 = kjit.autotune.tune(scale, cfgs, (None, 2.0, 100), key=["n"], timer=timer3, device=DEVICE)
    assert r3.index == 0 and timer3.calls == []   # the same sources as above: their records
    r4 = kjit.autotune.tune(scale, cfgs, (None, 2.0, 200), key=["n"], timer=timer3, device=DEVICE)
    assert r4.index == 1 and len(timer3.calls) == 2


def test_defines_are_part_of_a_config():
    timer = FakeTimer()
    r = make([Config(BS=64, defines={"FAST": 1}), Config(BS=64)], timer).tune(None, 2.0, 100)
    assert len(timer.calls) == 2 and r.candidates[0].options.defines == (("FAST", "1"),)


def test_outputs_to_protect_must_be_contiguous_device_arrays():
    from kjit.tune.timing import device_buffer

    class Fake:
        def __init__(self, strides):
            self.__cuda_array_interface__ = {"shape": (4, 4), "typestr": "<f4", "data": (4096, False),
                                             "strides": strides, "version": 3}
    assert device_buffer("y", Fake(None)) == (4096, 64)
    assert device_buffer("y", Fake((16, 4))) == (4096, 64)
    with pytest.raises(ArgumentError, match="'y'.*must be contiguous"):
        device_buffer("y", Fake((4, 16)))
    with pytest.raises(ArgumentError, match="'n' is named in restore_value/reset_to_zero but is a int"):
        device_buffer("n", 3)


def test_with_the_cache_off_nothing_is_kept(monkeypatch):
    monkeypatch.setenv("KJIT_CACHE", "0")
    for _ in range(2):
        timer = FakeTimer()
        make(CONFIGS[:2], timer).tune(None, 2.0, 4096)
        assert len(timer.calls) == 2
