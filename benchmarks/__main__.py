"""`python -m benchmarks all [--json FILE] [--plot FILE]`: launch cost, compile and cache,
build, PyTorch (tensor launches, operators, Triton, native ops), JAX (kjit's op against a C++
FFI handler and a native op: `python -m benchmarks jax`), and (on two GPUs) device 1
against device 0 and one thread per device, in one run on the GPU machine; prints a table
last."""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

TARGET_FRESH_RATIO = 1.05
# The launch rows held to a target (ratio to C's loop on the same stream, median of rounds, at
# every argument count): the README's idiom and what users write beside it.
TARGET_ROWS = {"kjit k[grid, block](...)": 1.05, "kjit k[grid, block, stream, 0](...)": 1.05,
               "kjit @kernel f[grid, block](...)": 1.05, "kjit bound launcher L(...)": 1.03,
               "kjit k[g, b, torch stream](torch tensor, ...)": 1.10,
               "kjit k[g, b, cupy stream](cupy array, ...)": 1.10}
TARGET_IMPORT_MS = 100
TARGET_REPEAT_US = 20
TARGET_DEVICE1_RATIO = 1.05    # device 1's launch cost within 5% of device 0's
TARGET_TWO_THREADS = 1.8       # two threads on two devices against one thread
TARGET_HEADERS_FRESH_MS = 20     # toolkit-header kernel: fresh-process disk hit beyond import
TARGET_HEADERS_REPEAT_US = 100   # toolkit-header kernel: in-process repeat
TARGET_SWEEP_SPEEDUP = 20        # compile_many against one bare NVRTC compile at a time (16 cores)
TARGET_COLD_SMALL = 1.10         # a fresh process's cold compile against bare NVRTC
TARGET_COLD_CUB = 1.05
TARGET_TORCH_RATIO = 1.10        # a torch-tensor launch against the same launch with kjit arrays
TARGET_CURRENT_STREAM_US = 0.3   # reading torch's current stream, per launch


def machine() -> dict:
    import kjit
    from kjit.cli.info import gather
    info = gather()
    return {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "gpu": [d["name"] for d in info["devices"]], "driver": info["driver"],
            "nvrtc": info["nvrtc"], "cuda_bindings": info["cuda_bindings"], "kjit": kjit.__version__}


def table(results: dict) -> str:
    lines = ["=== benchmark table ==="]
    m = results["machine"]
    lines.append(f"{', '.join(m['gpu'])}, driver {m['driver']}, NVRTC {m['nvrtc']}, "
                 f"cuda-bindings {m['cuda_bindings']}, Python {m['python']}, {m['date']}")
    launch = results.get("launch", {})
    c = launch.get("C cuLaunchKernel", {})
    if "error" in launch:
        lines.append(f"launch: {launch['error']}")
    if isinstance(c, dict) and c:
        lines.append("host-side launch cost: median us per launch, and the median of per-round ratios "
                     "to C [min-max] over the interleaved rounds (every round: launch_rounds in the JSON)")
        lines.append(f"{'toolkit':46s}" + "".join(f"{f'{n} args':>26s}" for n in c))
        for name, row in launch.items():
            if isinstance(row, str):
                lines.append(f"{name:46s}  {row}")
                continue
            cells = "".join(f"{r['us']:>7.2f} {r['ratio']:4.2f}x [{r['min']:4.2f}-{r['max']:4.2f}]"
                            for r in row.values())
            lines.append(f"{name:46s}{cells}")
    cc = results.get("compile_cache", {})
    if cc:
        _section(lines, "compile and cache", cc, 52, 2)
        bare = cc.get("bare driver fresh process to first launch ms")
        fresh = cc.get("kjit fresh process to first launch ms")
        if bare and fresh:
            lines.append(f"  {'kjit fresh process / bare driver':52s} {fresh / bare:10.2f}x "
                         f"(target <= {TARGET_FRESH_RATIO})")
            with_np = cc.get("bare driver + import numpy fresh process ms")
            if with_np:
                lines.append(f"  {'kjit fresh process / (bare driver + numpy)':52s} {fresh / with_np:10.2f}x")
    _section(lines, "two GPUs: launch cost by device, one thread per device",
             results.get("multigpu", {}), 52, 2, dicts=False)
    _section(lines, "the GIL around cuLaunchKernel, one Python thread", results.get("gil", {}), 60, 3)
    _section(lines, "CUDA graphs: host cost per kernel replayed, against launches one by one",
             results.get("graphs", {}), 60, 3)
    _section(lines, "toolkit-header kernel (CUB + cooperative groups + fp16) vs a small one, sm_90",
             results.get("headers", {}), 60, 2)
    _section(lines, "PyTorch: one small kernel on a tensor, median us per call over interleaved rounds",
             {k: v for k, v in results.get("torch_ops", {}).items() if k != "rounds"}, 72, 2)
    _section(lines, "kjit build of the example library", results.get("build", {}), 52, 1)
    _section(lines, "precompiled headers across processes (CUB kernel): edit loop and compile_many sweep",
             {k: v for k, v in results.get("pch_persist", {}).items() if k != "targets"}, 72, 3)
    if results.get("throughput"):
        from benchmarks.throughput import lines as throughput_lines
        lines += throughput_lines(results["throughput"])
    if results.get("jax_ops"):
        from benchmarks.jax_ops import lines as jax_lines
        lines += jax_lines(results["jax_ops"])
    tu = results.get("tune", {})
    if tu:
        from benchmarks.tune import table as tune_table
        lines.append(tune_table(tu) if "error" not in tu else f"tune: {tu['error']}")
    lines.append("targets: " + ", ".join(f"{k}: {'met' if ok else 'MISSED'}" for k, ok in targets(results).items()))
    return "\n".join(lines)


def _section(lines: list[str], title: str, values: dict, width: int, digits: int,
             dicts: bool = True) -> None:
    """A titled block of `name  value` lines (floats to `digits` places); nothing if empty.
    dicts=False leaves out values that are dicts (per-round detail kept for the JSON)."""
    if not values:
        return
    lines.append(title)
    for k, v in values.items():
        if isinstance(v, float):
            lines.append(f"  {k:{width}s} {v:10.{digits}f}")
        elif dicts or not isinstance(v, dict):
            lines.append(f"  {k:{width}s} {v}")


def targets(results: dict) -> dict[str, bool]:
    out = {}
    jx = results.get("jax_ops", {})
    if "ratio" in jx:
        out[f"JAX op kjit / C++ FFI handler <= {jx['target']}x (median of rounds)"] = jx["ratio"] <= jx["target"]
    launch = results.get("launch", {})
    for name, target in TARGET_ROWS.items():
        row = launch.get(name)
        if isinstance(row, dict):
            for n, r in row.items():
                out[f"{name} {n} args <= {target}x C (median)"] = r["ratio"] <= target
    cc = results.get("compile_cache", {})
    paired = cc.get("kjit fresh / bare, median of paired runs")
    if paired:   # the same paired method as the launch rows: "1.010x [0.820-1.159]"
        out[f"fresh process <= {TARGET_FRESH_RATIO}x bare (median of paired runs)"] = \
            float(paired.split("x")[0]) <= TARGET_FRESH_RATIO
    if "import kjit ms" in cc:
        out[f"import kjit <= {TARGET_IMPORT_MS} ms"] = cc["import kjit ms"] <= TARGET_IMPORT_MS
    if "kjit in-process repeat us" in cc:
        out[f"repeat compile <= {TARGET_REPEAT_US} us"] = cc["kjit in-process repeat us"] <= TARGET_REPEAT_US
    mg = results.get("multigpu", {})
    if "device 1 / device 0" in mg:
        out[f"launch on device 1 <= {TARGET_DEVICE1_RATIO}x device 0"] = \
            mg["device 1 / device 0"] <= TARGET_DEVICE1_RATIO
    if "two threads / one thread" in mg:
        out[f"two threads on two devices >= {TARGET_TWO_THREADS}x one"] = \
            mg["two threads / one thread"] >= TARGET_TWO_THREADS
    sw = results.get("throughput", {}).get("sweep", {})
    if "speed-up" in sw:
        out[f"compile_many of {sw['variants']} CUB variants >= {TARGET_SWEEP_SPEEDUP}x bare NVRTC "
            "one at a time"] = sw["speed-up"] >= TARGET_SWEEP_SPEEDUP
    cold = results.get("throughput", {}).get("cold", {})
    for kernel, target in (("small", TARGET_COLD_SMALL), ("CUB", TARGET_COLD_CUB)):
        ratio = cold.get(f"{kernel} kernel: kjit (the device's arch) / bare NVRTC")
        if ratio:
            out[f"{kernel} kernel fresh cold compile <= {target}x bare NVRTC"] = \
                float(ratio.split("x")[0]) <= target
    to = results.get("torch_ops", {})
    r = to.get("torch tensor / kjit array launch, median of paired batch ratios")
    if r:
        out[f"torch-tensor launch <= {TARGET_TORCH_RATIO}x kjit-array launch (median)"] = \
            float(r.split("x")[0]) <= TARGET_TORCH_RATIO
    d = to.get("reading torch's current stream: auto - named us, median of per-round differences")
    if d is not None:
        out[f"reading torch's current stream <= {TARGET_CURRENT_STREAM_US} us"] = d <= TARGET_CURRENT_STREAM_US
    r = to.get("as_torch_op / Library.define/impl, median of paired batch ratios")
    if r:
        out["as_torch_op per call <= Library.define/impl (median)"] = float(r.split("x")[0]) <= 1.0
    hd = results.get("headers") or cc
    key = "headers kernel: fresh-process disk hit beyond import kjit ms"
    if key in hd:
        out[f"toolkit-header kernel fresh hit <= {TARGET_HEADERS_FRESH_MS} ms beyond import"] = \
            hd[key] <= TARGET_HEADERS_FRESH_MS
        out[f"toolkit-header kernel repeat <= {TARGET_HEADERS_REPEAT_US} us"] = \
            hd["headers kernel: in-process repeat us"] <= TARGET_HEADERS_REPEAT_US
    for name, ok in (results.get("tune") or {}).get("targets", {}).items():
        out["autotune: " + name] = ok
    for name, ok in (results.get("pch_persist") or {}).get("targets", {}).items():
        out["PCH: " + name] = ok
    return out


def plot(results: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    launch = {k: v for k, v in results.get("launch", {}).items() if isinstance(v, dict)}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, (name, row) in enumerate(launch.items()):
        xs = list(row)
        ax.plot([int(x) for x in xs], [row[x]["ratio"] for x in xs], marker="o", label=name,
                color=colors[i % len(colors)])
    ax.set_xlabel("kernel arguments")
    ax.set_ylabel("host cost per launch / C's loop\n(median of per-round ratios)")
    ax.set_xticks([1, 3, 16])
    ax.set_yscale("log")
    ticks = [1, 1.1, 1.25, 1.5, 2, 3, 4]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}×" for t in ticks])
    ax.minorticks_off()
    m = results["machine"]
    gpus = m["gpu"]
    ax.set_title(f"Launch cost against C, {gpus[0]}" + (f" (of {len(gpus)})" if len(gpus) > 1 else "")
                 + f", {m['date']}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("which", nargs="?", default="all",
                   choices=["all", "launch", "compile", "build", "multigpu", "headers", "throughput", "tune", "torch",
                            "graphs", "gil", "jax", "pch"],
                   help="headers: the toolkit-header kernel's compile figures only (no GPU needed)")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--plot", help="write the launch-cost plot (PNG) here")
    p.add_argument("--pool", nargs="+", metavar="JSON",
                   help="launch: instead of running, pool the rounds of these runs' JSON files")
    args = p.parse_args(argv)
    if args.pool:
        if args.which != "launch":
            p.error("--pool goes with launch only")
        return _pool(args)
    results: dict = {"machine": machine()}
    sections = {"launch": "launch", "compile": "compile_cache", "build": "build",
                "multigpu": "multigpu", "throughput": "throughput", "tune": "tune", "torch": "torch_ops",
                "graphs": "graphs", "gil": "gil", "jax": "jax_ops", "pch": "pch_persist"}
    if args.which == "headers":
        from benchmarks.compile_cache import headers_run
        results["headers"] = headers_run()
    for which, module in sections.items():
        if args.which not in ("all", which) or args.which == "headers":
            continue
        try:  # one failing section must not lose the others' figures
            mod = __import__(f"benchmarks.{module}", fromlist=["run"])
            data = mod.run()
            if which == "launch":
                data, results["launch_rounds"] = data
        except (Exception, SystemExit) as exc:
            data = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"benchmark {which} failed: {data['error']}", file=sys.stderr)
        if which == "launch":
            data = {k: ({int(n): v for n, v in row.items()} if isinstance(row, dict) else row)
                    for k, row in data.items()}
        results[module] = data
    results["targets"] = targets(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    if args.plot:
        plot(results, args.plot)
    print(table(results))
    return 0


def _pool(args: argparse.Namespace) -> int:
    """`launch --pool a.json b.json ...`: the launch table from several runs' rounds together."""
    from benchmarks.launch import pooled
    data, rounds = pooled(args.pool)
    first = json.loads(Path(args.pool[0]).read_text())
    results = {"machine": dict(first["machine"], pooled=args.pool), "launch_rounds": rounds,
               "launch": {k: ({int(n): v for n, v in row.items()} if isinstance(row, dict) else row)
                          for k, row in data.items()}}
    results["targets"] = targets(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    if args.plot:
        plot(results, args.plot)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
