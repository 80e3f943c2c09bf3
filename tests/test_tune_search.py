"""Autotuning's steps without a GPU: prune_configs_by before anything compiles, the search
strategy as an argument, early stopping's rule, compile results as they finish. NVRTC
compiles for real; a Python timer stands in for CUDA events (tests/test_tune.py)."""
from __future__ import annotations

import pytest

import kjit
from kjit import ArgumentError
from test_tune import CONFIGS, DEVICE, FakeTimer, make, scale_source

Config = kjit.autotune.Config


@pytest.fixture
def compiles():
    """The compile lookups this process makes (one per configuration compiled)."""
    seen = []
    listener = kjit.cache.add_listener(lambda e: seen.append(e) if e.namespace == "compile" else None)
    yield seen
    kjit.cache.remove_listener(listener)


def test_pruned_configs_are_never_compiled_or_timed(compiles):
    timer = FakeTimer({64: 3.0, 128: 2.0, 256: 0.5})
    seen_args = []

    def small_blocks(configs, named):
        seen_args.append(named)
        return [c for c in configs if c.params["BS"] <= 128 and "UNROLL" not in c.params]

    f = make(CONFIGS, timer, prune_configs_by=small_blocks)
    r = f.tune(None, 2.0, 10000)
    assert r.config.params == dict(BS=128) and r.measured == 2
    assert sorted(c["BS"] for c in timer.calls) == [64, 128]
    assert len(compiles) == 2                        # BS=256 and UNROLL=4: not even compiled
    assert [c.object is None for c in r.candidates] == [False, False, True, True]
    assert r.pruned == [2, 3]
    assert [row["status"] for row in r.table()] == ["ok", "ok", "pruned", "pruned"]
    assert seen_args == [{"x": None, "a": 2.0, "n": 10000}]


def test_pruning_depends_on_the_arguments_and_functions_chain():
    timer = FakeTimer()
    by_size = lambda configs, named: [c for c in configs if c.params["BS"] * 10 <= named["n"]]  # noqa: E731
    no_unroll = lambda configs, named: [c for c in configs if "UNROLL" not in c.params]       # noqa: E731
    f = make(CONFIGS, timer, prune_configs_by=[by_size, no_unroll])
    assert f.tune(None, 1.0, 2000).pruned == [2, 3]      # 256 * 10 > 2000
    assert f.tune(None, 1.0, 5000).pruned == [3]


@pytest.mark.parametrize("result, words", [
    (None, "returned NoneType"),
    (Config(BS=64), "returned Config"),
    ([], "kept no configuration"),
    ([Config(BS=32)], "not one of the configs it was given"),
    (["BS=64"], "returned a str at position 0"),
])
def test_bad_prune_results_are_errors_naming_the_function(result, words):
    def my_pruner(configs, named):
        return result
    f = make(CONFIGS[:2], FakeTimer(), prune_configs_by=my_pruner)
    with pytest.raises(ArgumentError, match="my_pruner") as info:
        f.tune(None, 1.0, 1000)
    assert words in str(info.value)


def test_a_failing_prune_function_is_named():
    def broken(configs, named):
        return named["m"]
    f = make(CONFIGS[:2], FakeTimer(), prune_configs_by=broken)
    with pytest.raises(ArgumentError, match=r"broken failed: KeyError: 'm'"):
        f.tune(None, 1.0, 1000)
    with pytest.raises(ArgumentError, match="prune_configs_by takes a function"):
        make(CONFIGS[:2], FakeTimer(), prune_configs_by=[broken, 3])


class FirstTwo:
    """A strategy of one's own: time the first two candidates only."""

    def __init__(self):
        self.calls = []

    def search(self, candidates, records, measure):
        self.calls.append(([c.index for c in candidates], dict(records)))
        got = measure(candidates[:2])
        assert [r["status"] for r in got] == ["ok", "ok"]


def test_a_search_strategy_gets_the_kept_candidates_and_measures_what_it_asks():
    timer = FakeTimer({64: 3.0, 128: 2.0, 256: 0.5})
    strategy = FirstTwo()
    keep = lambda configs, named: configs[1:]   # noqa: E731
    f = make(CONFIGS, timer, search=strategy, prune_configs_by=keep)
    r = f.tune(None, 1.0, 1000)
    assert strategy.calls == [([1, 2, 3], {})]
    assert sorted(c["BS"] for c in timer.calls) == [128, 256]
    assert r.config.params == dict(BS=256) and r.measured == 2
    assert [row["status"] for row in r.table()] == ["pruned", "ok", "ok", "not timed"]
    # a second tuner on the same cache: the strategy sees the stored records, nothing is timed
    again = FirstTwo()
    r2 = make(CONFIGS, timer, search=again, prune_configs_by=keep).tune(None, 1.0, 1000)
    assert sorted(again.calls[0][1]) == [1, 2] and r2.measured == 0 and len(timer.calls) == 2
    assert r2.config.params == dict(BS=256)


def test_a_plain_function_is_a_strategy_too():
    timer = FakeTimer({64: 3.0, 128: 2.0})
    f = make(CONFIGS, timer, search=lambda cands, records, measure: measure(cands[:2]))
    assert f.tune(None, 1.0, 1000).config.params == dict(BS=128) and len(timer.calls) == 2


def test_random_search_times_its_budget_the_same_ones_each_run():
    timer = FakeTimer()
    r = make(CONFIGS, timer, search=kjit.autotune.RandomSearch(2, seed=3)).tune(None, 1.0, 1000)
    first = [dict(c) for c in timer.calls]
    assert r.measured == 2 and len(first) == 2
    assert r.config.params in first
    timer2 = FakeTimer()
    make(CONFIGS, timer2, search=kjit.autotune.RandomSearch(2, seed=3)).tune(None, 1.0, 2000)
    assert timer2.calls == first                  # another key, the same draw


def test_random_search_goes_on_while_nothing_it_drew_runs():
    timer = FakeTimer()

    @kjit.autotune(configs=[Config(BS=b) for b in (2048, 4096, 64)], key=["n"], timer=timer,
                   device=DEVICE, block=lambda m: 64, grid=1,
                   search=kjit.autotune.RandomSearch(1, seed=0))
    @kjit.kernel(arch="sm_90")
    def scale(BS=128, UNROLL=1):
        return scale_source(BS, UNROLL)     # BS over 1024 fails its static_assert
    r = scale.tune(None, 1.0, 1000)
    assert r.config.params == dict(BS=64)
    assert all(rec is None or rec["status"] in ("ok", "compile_error") for rec in r.records)


@pytest.mark.parametrize("search, words", [
    ("annealing", "not a strategy kjit knows"),
    (42, "search must be"),
])
def test_bad_search_arguments(search, words):
    with pytest.raises(ArgumentError, match=words):
        make(CONFIGS[:2], FakeTimer(), search=search)
    with pytest.raises(ArgumentError, match="budget"):
        kjit.autotune.RandomSearch(0)


def test_a_strategy_must_measure_candidates_it_was_given():
    f = make(CONFIGS[:2], FakeTimer(), search=lambda cands, records, measure: measure([Config(BS=64)]))
    with pytest.raises(ArgumentError, match="measure\\(\\) with a Config"):
        f.tune(None, 1.0, 1000)


@pytest.mark.parametrize("value", [-0.1, "0.2", True])
def test_bad_early_stop_margins(value):
    with pytest.raises(ArgumentError, match="early_stop"):
        make(CONFIGS[:2], FakeTimer(), early_stop=value)


@pytest.mark.parametrize("value", [-0.01, "0.05", True, 100])
def test_bad_screen_margins(value):
    with pytest.raises(ArgumentError, match="screen"):
        make(CONFIGS[:2], FakeTimer(), screen=value)


def test_the_early_stop_rule():
    from kjit.tune.timing import EarlyStop
    best = [None]
    stop = EarlyStop(0.2, lambda: best[0])
    assert not stop([9.0, 9.0, 9.0])              # nothing to compare with yet
    best[0] = 1.0
    assert not stop([9.0, 9.0])                   # fewer than 3 repeats
    assert stop([1.3, 1.25, 1.21])                # even the fastest is over 1.2x the best
    assert not stop([1.3, 1.25, 1.19])            # one repeat within the margin: timed in full
    assert not stop([1.2, 1.3, 1.4])              # exactly at the margin is not "clearly slower"
    # after its first launch: only one far slower than the best, beyond what loading costs
    best[0] = 2.0
    assert stop.hopeless(100.0) and stop.hopeless(5.81)
    assert not stop.hopeless(5.79)                # 2 x 1.2 x 2.0 + 1 ms
    best[0] = None
    assert not stop.hopeless(1e6)                 # nothing to compare with yet


def test_compile_many_reports_each_result_as_it_finishes():
    from kjit.compiler.many import compile_many
    sources = [scale_source(bs) for bs in (32, 64, 96, 2048)]
    got = {}
    out = compile_many(sources, arch="sm_90", target="cubin", errors="return", progress=False,
                       on_result=lambda i, r: got.setdefault(i, r), jobs=2)
    assert sorted(got) == [0, 1, 2, 3]
    assert all(got[i] is out[i] for i in range(4))
    assert isinstance(out[3], kjit.CompileError)
