"""Benchmark: the cost per call of running one small kernel on a PyTorch tensor, every way a
PyTorch user can: a kjit launch with kjit arrays (the baseline), with a torch tensor on
torch's current stream (read in C), with the stream named, with
`torch.cuda.current_stream()` from Python, kjit's `as_torch_op` operator, the same kernel
wrapped by hand with `torch.library.Library.define/impl` and with `torch.library.custom_op`,
a Triton kernel, and PyTorch's own `x.add_(1)`. Each result is checked on the device.

Rows take turns round after round for the per-call figures. The ratios the targets name compare
two rows batch against batch: a pair of 200-call batches, one of each row back to back (their
order alternating), gives one ratio, and the ratio reported is the median over 101 pairs
[min-max]; the machine's drift between rows seconds apart (up to ±30% on the GPU host) then
cancels."""
from __future__ import annotations

import statistics

import numpy as np

import kjit

import time

from .timing import PER_BATCH, WARMUP, per_launch_us

N = 1024
ROUNDS = 9
PAIRS = 101
BATCHES_PER_ROUND = 10
PER_ROUND = (WARMUP + BATCHES_PER_ROUND) * PER_BATCH
SOURCE = r'''
extern "C" __global__ void add_one(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}'''

KJIT_ARRAY = "kjit k[g, b](kjit array)"
TORCH_AUTO = "kjit k[g, b](torch tensor): torch's current stream"
TORCH_NAMED = "kjit k[g, b, s](torch tensor): stream named"
TORCH_PY_CURRENT = "kjit k[g, b, torch.cuda.current_stream()](torch tensor)"
OP = "kjit as_torch_op: op(x, n)"
LIBRARY = "torch.library Library.define/impl around k[g, b]"
CUSTOM_OP = "torch.library.custom_op around k[g, b]"
TRITON = "Triton kernel"
NATIVE = "PyTorch x.add_(1)"


def _rows(torch, operators: bool):
    """name -> (launch(), the array it increments, its sync); the operator rows too if
    `operators`."""
    k = kjit.load(kjit.compile(SOURCE)).get_function("add_one")
    grid = kjit.cdiv(N, 256)
    sync = torch.cuda.synchronize
    rows = {}
    arr = kjit.zeros(N, np.float32)
    rows[KJIT_ARRAY] = (lambda: k[grid, 256](arr, N), arr, kjit.synchronize)
    t_auto = torch.zeros(N, device="cuda")
    rows[TORCH_AUTO] = (lambda: k[grid, 256](t_auto, N), t_auto, sync)
    s = torch.cuda.current_stream()
    t_named = torch.zeros(N, device="cuda")
    rows[TORCH_NAMED] = (lambda: k[grid, 256, s](t_named, N), t_named, sync)
    t_py = torch.zeros(N, device="cuda")
    rows[TORCH_PY_CURRENT] = (lambda: k[grid, 256, torch.cuda.current_stream()](t_py, N), t_py, sync)
    if not operators:
        return rows

    op = k.as_torch_op("kjit_bench::add_one", grid=lambda x, n: (kjit.cdiv(n, 256),), block=256)
    t_op = torch.zeros(N, device="cuda")
    rows[OP] = (lambda: op(t_op, N), t_op, sync)

    lib = torch.library.Library("kjit_bench_lib", "FRAGMENT")
    lib.define("add_one(Tensor(a!) x, SymInt n) -> ()")
    lib.impl("add_one", lambda x, n: k[kjit.cdiv(n, 256), 256](x, n), "CUDA")
    lib_op = torch.ops.kjit_bench_lib.add_one
    t_lib = torch.zeros(N, device="cuda")
    rows[LIBRARY] = (lambda: lib_op(t_lib, N), t_lib, sync)
    rows["_keep"] = lib   # the Library must outlive the timing

    try:   # the schema spelled out: this module's annotations are strings
        custom = torch.library.custom_op("kjit_bench_co::add_one", mutates_args={"x"},
                                         schema="(Tensor(a!) x, SymInt n) -> ()")(
            lambda x, n: k[kjit.cdiv(n, 256), 256](x, n))
        t_co = torch.zeros(N, device="cuda")
        rows[CUSTOM_OP] = (lambda: custom(t_co, N), t_co, sync)
    except Exception as exc:
        rows[CUSTOM_OP] = f"unavailable: {type(exc).__name__}: {exc}"

    try:
        rows[TRITON] = _triton_row(torch)
    except Exception as exc:   # Triton missing or changed its API
        rows[TRITON] = f"unavailable: {type(exc).__name__}: {exc}"
    t_native = torch.zeros(N, device="cuda")
    rows[NATIVE] = (lambda: t_native.add_(1), t_native, sync)
    return rows


def _triton_row(torch):
    import triton
    import triton.language as tl

    @triton.jit
    def add_one_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    t = torch.zeros(N, device="cuda")
    grid = (triton.cdiv(N, 256),)
    return (lambda: add_one_kernel[grid](t, N, BLOCK=256), t, torch.cuda.synchronize)


def _first(value) -> float:
    return float(value.get()[0]) if isinstance(value, kjit.DeviceArray) else float(value[0].item())


def _time(rows: dict) -> tuple[dict[str, list[float]], int]:
    """Interleaved rounds over the timed rows: their samples, and how many rounds ran."""
    timed = {name: r for name, r in rows.items() if isinstance(r, tuple)}
    samples: dict[str, list[float]] = {name: [] for name in timed}
    rounds = 0
    for r in range(-1, ROUNDS):   # round -1 warms every path untimed
        for name, (launch, _, sync) in timed.items():
            us = per_launch_us(launch, sync, batches=BATCHES_PER_ROUND)
            if r >= 0:
                samples[name].append(us)
        rounds += 1
    for name, (_, arr, sync) in timed.items():
        sync()
        got = _first(arr)
        if got != rounds * PER_ROUND:
            raise SystemExit(f"{name}: x[0] is {got}, expected {rounds * PER_ROUND}: its calls "
                             "did not all run")
    return samples, rounds


def _paired(rows: dict, a: str, b: str) -> str | None:
    """Row a against row b, batch against batch: the median over PAIRS of (b's batch time /
    a's), [min-max]; every call's increment checked afterwards."""
    if a not in rows or b not in rows:
        return None
    (la, arr_a, sa), (lb, arr_b, sb) = rows[a], rows[b]
    sa(), sb()
    before = _first(arr_a), _first(arr_b)
    calls = range(PER_BATCH)
    per = []
    for i in range(-WARMUP, PAIRS):
        took = {}
        for which, launch, sync in ((("a", la, sa), ("b", lb, sb)) if i % 2 else
                                    (("b", lb, sb), ("a", la, sa))):
            t0 = time.perf_counter_ns()
            for _ in calls:
                launch()
            took[which] = time.perf_counter_ns() - t0
            sync()
        if i >= 0:
            per.append(took["b"] / took["a"])
    n = (PAIRS + WARMUP) * PER_BATCH
    for name, arr, was in ((a, arr_a, before[0]), (b, arr_b, before[1])):
        if _first(arr) != was + n:
            raise SystemExit(f"{name}: x[0] is {_first(arr)}, expected {was + n}: its calls did not all run")
    return f"{statistics.median(per):.3f}x [{min(per):.3f}-{max(per):.3f}]"


def _ratio(samples: dict, a: str, b: str) -> str | None:
    if a not in samples or b not in samples:
        return None
    per = [x / y for x, y in zip(samples[a], samples[b])]
    return f"{statistics.median(per):.3f}x [{min(per):.3f}-{max(per):.3f}]"


def _diff(samples: dict, a: str, b: str) -> float | None:
    if a not in samples or b not in samples:
        return None
    return round(statistics.median(x - y for x, y in zip(samples[a], samples[b])), 3)


def run() -> dict:
    import sys

    import torch
    out: dict = {}
    # Phase 1, an eager program: the launches alone, before anything imports torch._dynamo
    if "torch._dynamo" not in sys.modules:
        launches = {name: r for name, r in _rows(torch, operators=False).items()}
        first, _ = _time(launches)
        for name, v in first.items():
            out[f"{name} (no Dynamo)"] = round(statistics.median(v), 3)
        out["torch tensor / kjit array launch, median of paired batch ratios"] = \
            _paired(launches, KJIT_ARRAY, TORCH_AUTO)
        out["reading torch's current stream: auto - named us, median of per-round differences"] = \
            _diff(first, TORCH_AUTO, TORCH_NAMED)
    # Phase 2, every row. Calling a custom_op imports torch._dynamo, after which `k[...]` takes
    # a Python __getitem__ (kjit/runtime/torch_compile.py): import it first, so every row and
    # round is timed in the state a program using torch.compile or custom ops is in
    import torch._dynamo  # noqa: F401
    rows = _rows(torch, operators=True)
    samples, _ = _time(rows)
    for name, v in samples.items():
        out[name] = round(statistics.median(v), 3)
    for name, r in rows.items():
        if isinstance(r, str):
            out[name] = r
    out["with Dynamo: torch tensor / kjit array launch, median of paired batch ratios"] = _paired(rows, KJIT_ARRAY, TORCH_AUTO)
    out["as_torch_op / Library.define/impl, median of paired batch ratios"] = \
        _paired(rows, LIBRARY, OP)
    out["as_torch_op / custom_op, median of per-round ratios"] = _ratio(samples, OP, CUSTOM_OP)
    out["rounds"] = {name: [round(x, 3) for x in v] for name, v in samples.items()}
    return out
