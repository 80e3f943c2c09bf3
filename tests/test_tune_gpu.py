"""Autotuning on the GPU: real timings with CUDA events, outputs protected, device limits."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kjit

pytestmark = pytest.mark.gpu
np = pytest.importorskip("numpy")
Config = kjit.autotune.Config
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def axpy(configs, **kw):
    @kjit.autotune(configs=configs, key=["n"], block=lambda m: m["BS"],
                   grid=lambda m: kjit.cdiv(m["n"], m["BS"] * m["PER"]), rep_ms=5, warmup_ms=2, **kw)
    @kjit.kernel
    def add(BS=128, PER=1):
        return f'''
extern "C" __global__ void add(const float* x, float* y, int n) {{
    int i = (blockIdx.x * {BS} + threadIdx.x) * {PER};
    for (int u = 0; u < {PER}; ++u) if (i + u < n) y[i + u] += x[i + u];
}}'''
    return add


CONFIGS = [Config(BS=64), Config(BS=256), Config(BS=128, PER=4), Config(BS=512, PER=2)]


def test_tuning_a_real_kernel_picks_a_config_that_gives_correct_results():
    n = 1 << 20
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y0 = np.arange(n, dtype=np.float32)
    X, Y = kjit.to_device(x), kjit.to_device(y0)
    add = axpy(CONFIGS, restore_value=["y"])
    r = add.tune(X, Y, n)
    assert r.measured == 4 and all(rec["status"] == "ok" and rec["ms"] > 0 and rec["reps"] >= 10
                                   for rec in r.records)
    assert r.ms == min(rec["ms"] for rec in r.records)
    np.testing.assert_array_equal(Y.get(), y0)          # restored after every candidate
    add(X, Y, n)
    kjit.synchronize()
    np.testing.assert_allclose(Y.get(), y0 + x)         # exactly one launch's effect


def test_without_restore_value_tuning_launches_change_the_output():
    """The check above can fail: tuning launches the kernel many times."""
    n = 4096
    X, Y = kjit.to_device(np.ones(n, np.float32)), kjit.to_device(np.zeros(n, np.float32))
    axpy(CONFIGS[:2]).tune(X, Y, n)
    assert Y.get()[0] > 10


def test_reset_to_zero_zeroes_before_each_launch_and_restores_after():
    n = 4096
    X = kjit.to_device(np.ones(n, np.float32))
    Y = kjit.to_device(np.full(n, 7.0, np.float32))
    add = axpy(CONFIGS[:2], reset_to_zero=["y"])
    add(X, Y, n)
    kjit.synchronize()
    np.testing.assert_array_equal(Y.get(), np.full(n, 8.0, np.float32))


def test_configs_over_the_device_limits_are_skipped_with_reasons():
    @kjit.autotune(configs=[Config(BS=128, block=2048), Config(BS=128, block=128, shared_mem=1 << 20),
                            Config(BS=128, block=128)],
                   key=["n"], grid=lambda m: kjit.cdiv(m["n"], 128), rep_ms=5, warmup_ms=2)
    @kjit.kernel
    def bounded(BS=128):
        return f'''
extern "C" __global__ void __launch_bounds__({BS}) bounded(float* y, int n) {{
    extern __shared__ float scratch[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f;
}}'''
    n = 1024
    Y = kjit.zeros(n, "float32")
    r = bounded.tune(Y, n)
    assert r.index == 2
    assert r.records[0]["status"] == "skipped" and "2048 threads exceeds the kernel's limit of 128" in r.records[0]["reason"]
    assert r.records[1]["status"] == "skipped" and "shared memory exceeds" in r.records[1]["reason"]
    bounded(Y, n)
    kjit.synchronize()
    assert Y.get().sum() == n


def test_a_second_process_times_nothing():
    script = textwrap.dedent(f'''
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import numpy as np, kjit, test_tune_gpu as t
        n = 1 << 16
        X, Y = kjit.to_device(np.ones(n, np.float32)), kjit.zeros(n, "float32")
        r = t.axpy(t.CONFIGS).tune(X, Y, n)
        print(json.dumps({{"measured": r.measured, "index": r.index}}))
    ''')
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[0]["measured"] == 4 and runs[1] == dict(runs[0], measured=0)


def test_the_sgemm_example_is_correct(capsys):
    runpy.run_path(str(EXAMPLES / "autotune_sgemm.py"), run_name="not_main")["main"](512)
    assert "ok" in capsys.readouterr().out


def test_every_sgemm_config_that_compiles_is_correct():
    ex = runpy.run_path(str(EXAMPLES / "autotune_sgemm.py"), run_name="not_main")
    n = 256
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    A, B, C = kjit.to_device(a), kjit.to_device(b), kjit.empty((n, n), "float32")
    ref = a @ b
    ran = 0
    for cfg in ex["space"]():
        k = ex["sgemm"].specialize(**cfg.params)
        try:
            k.kernel()
        except kjit.CompileError:
            continue
        p = cfg.params
        k[(n // p["BN"], n // p["BM"]), cfg.block](A, B, C, n, n, n)
        kjit.synchronize()
        err = np.abs(C.get() - ref).max() / np.abs(ref).max()
        assert err < 1e-5, (cfg, err)
        ran += 1
    assert ran >= 32


def test_tuning_kernels_loaded_by_hand():
    kernels = []
    for per in (1, 4):
        src = f'''extern "C" __global__ void add(const float* x, float* y, int n) {{
            int i = (blockIdx.x * blockDim.x + threadIdx.x) * {per};
            for (int u = 0; u < {per}; ++u) if (i + u < n) y[i + u] += x[i + u]; }}'''
        kernels.append(kjit.load(kjit.compile(src)).get_function("add"))
    n = 1 << 18
    X, Y = kjit.to_device(np.ones(n, np.float32)), kjit.zeros(n, "float32")
    cfgs = [Config(PER=1, block=256, grid=n // 256), Config(PER=4, block=256, grid=n // 1024)]
    r = kjit.autotune.tune(kernels, cfgs, (X, Y, n), key=["n"], restore_value=["y"],
                           rep_ms=5, warmup_ms=2)
    assert r.candidate.loaded() is kernels[r.index] and r.measured == 2
    np.testing.assert_array_equal(Y.get(), np.zeros(n, np.float32))
    r.launch(X, Y, n)
    kjit.synchronize()
    np.testing.assert_array_equal(Y.get(), np.ones(n, np.float32))


def test_torch_tensors_on_a_torch_stream():
    torch = pytest.importorskip("torch")
    n = 1 << 16
    x = torch.ones(n, device="cuda")
    y = torch.zeros(n, device="cuda")
    add = axpy(CONFIGS, restore_value=["y"])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        r = add.tune(x, y, n)
        add(x, y, n, stream=s.cuda_stream)
    s.synchronize()
    assert r.measured == 4 and all(rec["status"] == "ok" for rec in r.records)
    assert torch.equal(y, torch.ones(n, device="cuda"))


def spin(configs, **kw):
    """A kernel whose time grows with WORK (a dependent chain per thread): clear differences."""
    @kjit.autotune(configs=configs, key=["n"], block=256, grid=lambda m: kjit.cdiv(m["n"], 256),
                   restore_value=["y"], **kw)
    @kjit.kernel
    def chain(WORK=1):
        return f'''
extern "C" __global__ void chain(float* y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = y[i];
    for (int k = 0; k < {WORK} * 4096; ++k) v = v * 0.999f + 1.0f;
    y[i] = v;
}}'''
    return chain


def in_order(candidates, records, measure):
    """Time one candidate after another, in the configs' order (the fastest first here)."""
    for c in candidates:
        measure([c])


def test_early_stop_cuts_clearly_slower_candidates_and_keeps_the_choice():
    n = 1 << 16
    Y = kjit.to_device(np.ones(n, np.float32))
    configs = [Config(WORK=16), Config(WORK=48), Config(WORK=96)]
    r = spin(configs, search=in_order, screen=None, device={"name": "early stop"}).tune(Y, n)
    full = spin(configs, search=in_order, early_stop=None, screen=None,
                device={"name": "every repeat"}).tune(Y, n)
    assert r.index == full.index == 0
    assert not r.records[0].get("stopped") and r.records[0]["reps"] >= 10
    for i in (1, 2):   # 3x and 6x slower: stopped after a few repeats
        assert r.records[i]["stopped"] and r.records[i]["reps"] < full.records[i]["reps"]
        assert r.records[i]["ms"] > 1.2 * r.ms
    np.testing.assert_array_equal(Y.get(), np.ones(n, np.float32))   # restored


def test_a_configuration_far_slower_than_the_best_stops_after_its_first_launch():
    n = 1 << 16
    Y = kjit.to_device(np.ones(n, np.float32))
    configs = [Config(WORK=16), Config(WORK=2048)]   # the second over 100x slower
    r = spin(configs, search=in_order, device={"name": "first launch"}).tune(Y, n)
    assert r.index == 0
    slow = r.records[1]
    assert slow["stopped"] and slow["reps"] == 1 and slow["ms"] > 50 * r.ms
    full = spin(configs, search=in_order, early_stop=None, screen=None,
                device={"name": "first launch, every repeat"}).tune(Y, n)
    assert full.records[1]["reps"] >= 10 and not full.records[1].get("stopped")
    np.testing.assert_array_equal(Y.get(), np.ones(n, np.float32))   # restored


def test_the_screen_times_in_full_only_the_configurations_near_the_best():
    n = 1 << 16
    Y = kjit.to_device(np.ones(n, np.float32))
    configs = [Config(WORK=48), Config(WORK=16), Config(WORK=96)]
    r = spin(configs, device={"name": "screen"}).tune(Y, n)
    full = spin(configs, screen=None, early_stop=None, device={"name": "no screen"}).tune(Y, n)
    assert r.index == full.index == 1
    assert not r.records[1].get("screened") and r.records[1]["reps"] >= 10
    for i in (0, 2):   # 3x and 6x slower than WORK=16: their brief timing is their record
        assert r.records[i]["screened"] and r.records[i]["reps"] < full.records[i]["reps"]
        assert r.records[i]["ms"] > 1.2 * r.ms
    assert not any(rec.get("screened") for rec in full.records)
    again = spin(configs, device={"name": "screen"}).tune(Y, n)   # stored: nothing timed again
    assert again.measured == 0 and again.index == 1
    np.testing.assert_array_equal(Y.get(), np.ones(n, np.float32))   # restored


def test_bench_stops_when_told_and_only_then():
    from kjit.tune.timing import bench
    n = 1 << 16
    Y = kjit.to_device(np.ones(n, np.float32))
    k = spin([Config(WORK=16)]).function.specialize(WORK=16)
    launch = k[kjit.cdiv(n, 256), 256]
    full = bench(lambda: launch(Y, n), rep_ms=20, min_reps=30)
    cut = bench(lambda: launch(Y, n), rep_ms=20, min_reps=30, stop=lambda times: len(times) >= 3)
    assert "stopped" not in full and full["reps"] >= 30
    assert cut["stopped"] and 3 < cut["reps"] < full["reps"]


def test_sgemm_tuned_with_overlap_and_early_stop_chooses_as_exhaustive_timing_does():
    """The example's space (every other config) at 2048: the default (compiles overlapping
    timing, early stopping) against every repeat of every config. Two configs within timing
    noise of each other may swap places, so the choice must be within 3% of the best."""
    ex = runpy.run_path(str(EXAMPLES / "autotune_sgemm.py"), run_name="not_main")
    n = 2048
    rng = np.random.default_rng(0)
    A = kjit.to_device(rng.standard_normal((n, n), dtype=np.float32))
    B = kjit.to_device(rng.standard_normal((n, n), dtype=np.float32))
    C = kjit.empty((n, n), "float32")
    space = ex["space"]()[::2]
    fast = ex["tuned"](configs=space, device={"name": "default"}, progress=False).tune(A, B, C, n, n, n)
    full = ex["tuned"](configs=space, device={"name": "exhaustive"}, early_stop=None, screen=None,
                       progress=False).tune(A, B, C, n, n, n)
    ok = {i: rec["ms"] for i, rec in enumerate(full.records) if rec and rec["status"] == "ok"}
    assert fast.index in ok and ok[fast.index] <= 1.03 * min(ok.values()), (fast, full)
    assert any(rec and rec.get("stopped") for rec in fast.records)
    assert any(rec and rec.get("screened") for rec in fast.records)
    assert not any(rec and (rec.get("stopped") or rec.get("screened")) for rec in full.records)
    assert not fast.records[fast.index].get("screened")   # the choice was timed in full
