"""Benchmark: a cluster's start on one machine, with and without the shared Redis tier.

`python -m benchmarks.cluster [--procs 64] [--nodes 8] [--kernels 20] [--order same,rotated]
[--json FILE]`: PROCS processes in NODES groups, each group with its own cache directory (a
"node"), all start cold and compile the same KERNELS kernels. Measured per run: the wall
time from starting the processes to the last one's exit, and how many times NVRTC ran
(the cache's "miss" events). Order "same": every process compiles the kernels in the same
order (a job's ranks running one program); "rotated": process i starts at kernel i.

Then the cost of a hit: a lookup served by Redis (disk miss, fetch, checks, written to the
local disk) against one served by the local disk, in one process, and the first hit of a
fresh process (which imports redis-py and connects). Needs redis-server and redis-py; no GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90"
TARGET_WALL_RATIO = 0.25

# Self-contained kernels of 1.2-1.4 s of NVRTC CPU time each on the 2-core VM (an unrolled
# series of sines, 120 KB cubins): no header, so the key's include scan does not blur the
# figures, and NVRTC stays near 170 MB per process (kernels that include CUB take ~400 MB:
# 64 of them at once would not fit that machine).
KERNEL = r'''
template <int N> __device__ float series{i}(float x) {{
    float s = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) s = s * x + __sinf(x * (j + {i})) * cosf(s + j);
    return s;
}}
extern "C" __global__ void k{i}(float* y, const float* x, int n) {{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) y[t] = series{i}<{n}>(x[t]);
}}
'''


def kernels(count: int) -> list[str]:
    return [KERNEL.format(i=i, n=80 + i % 8) for i in range(count)]


WORKER = r'''
import hashlib, json, sys, time
import kjit, kjit.cache
cfg = json.load(open(sys.argv[1]))
me = int(sys.argv[2])
events = {}
def count(e):
    if e.namespace == "compile":
        events[e.event] = events.get(e.event, 0) + 1
kjit.cache.add_listener(count)
n = len(cfg["sources"])
order = list(range(n))
if cfg["order"] == "rotated":
    order = order[me % n:] + order[:me % n]
digests = {}
for i in order:
    digests[i] = hashlib.sha256(kjit.compile(cfg["sources"][i], arch=cfg["arch"]).code).hexdigest()
print(json.dumps({"events": events, "digests": digests, "end": time.time()}))
'''


class Redis:
    """redis-server on a free loopback port, in `directory`, without persistence."""

    def __init__(self, directory: Path):
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(exe):
            raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(directory), "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _env(cache_dir: Path, url: str | None) -> dict:
    env = dict(os.environ, KJIT_CACHE_DIR=str(cache_dir),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for name in [k for k in env if k.startswith("KJIT_REMOTE_CACHE")]:
        del env[name]
    if url:
        env["KJIT_REMOTE_CACHE"] = url
        env["KJIT_REMOTE_CACHE_UNSIGNED"] = "1"  # a private loopback server
    return env


def run_cluster(work: Path, url: str | None, procs: int, nodes: int, sources: list[str],
                order: str) -> dict:
    """One cold start of `procs` processes on `nodes` cache directories."""
    work.mkdir(parents=True)
    cfg = work / "job.json"
    cfg.write_text(json.dumps({"sources": sources, "arch": ARCH, "order": order}))
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    running = [subprocess.Popen([sys.executable, "-c", WORKER, str(cfg), str(i)],
                                env=_env(work / f"node{i % nodes}", url), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for i in range(procs)]
    results = []
    for p in running:
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a worker failed:\n{err[-3000:]}")
        results.append(json.loads(out.splitlines()[-1]))
    wall = max(r["end"] for r in results) - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers' CPU: steadier than wall
    cpu = usage.ru_utime + usage.ru_stime - usage0.ru_utime - usage0.ru_stime  # on a shared machine
    events: dict[str, int] = {}
    for r in results:
        for name, n in r["events"].items():
            events[name] = events.get(name, 0) + n
    for i in range(len(sources)):  # everyone got the same binary for each kernel
        if len({r["digests"][str(i)] for r in results}) != 1:
            raise SystemExit(f"kernel {i}: processes got different binaries")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 1), "nvrtc_compiles": events.get("miss", 0),
            "remote_hits": events.get("remote_hit", 0), "disk_hits": events.get("disk_hit", 0),
            "lookups": sum(events.values())}


HIT_COST = r'''
import json, sys, time
import kjit, kjit.cache
from kjit.cache import lookup
from kjit.compiler.cached import compile_key
sources, arch, rounds, mode = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), sys.argv[4]
t0 = time.perf_counter()
kjit.compile(sources[0], arch=arch)
first = time.perf_counter() - t0
keys = [compile_key(s, arch=arch) for s in sources]
times = []
for _ in range(rounds):
    c = lookup.current()
    c.memory.clear()
    if mode == "remote":  # the local disk loses them: every lookup goes to Redis
        for k in keys:
            c.disk.delete(k)
    for s in sources:
        t = time.perf_counter()
        obj = kjit.compile(s, arch=arch)
        times.append(time.perf_counter() - t)
        assert obj.cache_hit is True
print(json.dumps({"first_ms": first * 1e3, "times": times}))
'''


def hit_costs(work: Path, url: str, sources: list[str], rounds: int = 15) -> dict:
    """ms per lookup: a local disk hit vs a Redis hit (which includes writing it to disk);
    and the first lookup of a fresh process for each."""
    cfg = work / "sources.json"
    cfg.write_text(json.dumps(sources))
    out = {}
    for mode, cache_dir, tier in (("disk", work / "node0", None), ("remote", work / "fresh", url)):
        res = subprocess.run([sys.executable, "-c", HIT_COST, str(cfg), ARCH, str(rounds), mode],
                             env=_env(cache_dir, tier), capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"hit-cost run failed:\n{res.stderr[-3000:]}")
        r = json.loads(res.stdout)
        out[f"{mode} hit ms (median)"] = round(statistics.median(r["times"]) * 1e3, 3)
        out[f"{mode} hit ms (p90)"] = round(sorted(r["times"])[int(len(r["times"]) * 0.9)] * 1e3, 3)
        out[f"{mode} first hit in a fresh process ms"] = round(r["first_ms"], 1)
    out["redis hit - disk hit ms"] = round(out["remote hit ms (median)"] - out["disk hit ms (median)"], 3)
    return out


def machine() -> dict:
    import kjit
    from kjit.compiler import nvrtc
    try:
        import redis
        client = redis.__version__
    except ImportError:
        client = None
    server = subprocess.run([shutil.which("redis-server") or "/usr/bin/redis-server", "--version"],
                            capture_output=True, text=True).stdout.split()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {"date": datetime.datetime.now().isoformat(timespec="minutes"), "cpu": cpu,
            "cores": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") *
                                                          os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "load_before": round(os.getloadavg()[0], 1), "python": platform.python_version(),
            "kjit": kjit.__version__, "nvrtc": ".".join(map(str, nvrtc.version())),
            "redis_server": next((w[2:] for w in server if w.startswith("v=")), None),
            "redis_py": client}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster")
    p.add_argument("--procs", type=int, default=64)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--kernels", type=int, default=20)
    p.add_argument("--order", default="same,rotated", help="same, rotated, or both (comma-separated)")
    p.add_argument("--json", help="write the results as JSON here")
    args = p.parse_args(argv)
    sources = kernels(args.kernels)
    results: dict = {"machine": machine(), "procs": args.procs, "nodes": args.nodes,
                     "kernels": args.kernels, "runs": {}}
    print(json.dumps(results["machine"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="kjit-cluster-") as tmp:
        work = Path(tmp)
        for order in args.order.split(","):
            for tier in ("without", "with"):
                server = Redis(work / f"redis-{order}") if tier == "with" else None
                try:
                    r = run_cluster(work / f"{order}-{tier}", server and server.url, args.procs,
                                    args.nodes, sources, order)
                    if server is not None and order == args.order.split(",")[-1]:
                        results["hit_cost"] = hit_costs(work / f"{order}-{tier}", server.url, sources)
                finally:
                    if server is not None:
                        server.stop()
                results["runs"][f"{order} order, {tier} the tier"] = r
                print(f"{order} order, {tier} the tier: {r}", flush=True)
            without = results["runs"][f"{order} order, without the tier"]["wall_s"]
            with_ = results["runs"][f"{order} order, with the tier"]["wall_s"]
            results["runs"][f"{order} order, wall ratio"] = round(with_ / without, 3)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def table(results: dict) -> str:
    m = results["machine"]
    lines = [f"=== cluster benchmark: {results['procs']} processes on {results['nodes']} nodes, "
             f"{results['kernels']} kernels ===",
             f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, load {m['load_before']:.1f} "
             f"before; Redis {m['redis_server']}, redis-py {m['redis_py']}, NVRTC {m['nvrtc']}, {m['date']}"]
    for name, r in results["runs"].items():
        if isinstance(r, dict):
            lines.append(f"  {name:34s} wall {r['wall_s']:7.1f} s   CPU {r['cpu_s']:7.1f} s   NVRTC compiles {r['nvrtc_compiles']:4d}   "
                         f"remote hits {r['remote_hits']:4d}   disk hits {r['disk_hits']:4d}")
        else:
            lines.append(f"  {name:34s} {r:.3f} (target <= {TARGET_WALL_RATIO})")
    for k, v in results.get("hit_cost", {}).items():
        lines.append(f"  {k:44s} {v:9.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
