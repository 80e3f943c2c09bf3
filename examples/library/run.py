"""Build the example library into a fatbin with `kjit build`, then run it from the fatbin.

    python examples/library/run.py                  # build (+ run when a GPU is present)
    python examples/library/run.py --arch sm_90     # choose the architectures

The fatbin holds a cubin per architecture plus PTX for newer GPUs; `kjit inspect
library.fatbin` shows what is inside, with registers and shared memory per kernel.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import kjit
from kjit import driver

HERE = Path(__file__).resolve().parent
TILE = 256


def build(out: Path, archs: str) -> None:
    args = ["build", str(HERE / "kernels.cu"), "-o", str(out), "--arch", archs,
            "-I", str(HERE / "include"), "-D", f"TILE={TILE}"]
    exe = shutil.which("kjit")
    command = [exe] if exe else [sys.executable, "-m", "kjit"]  # not installed as a command
    if subprocess.run([*command, *args]).returncode:
        sys.exit("kjit build failed (its message is above)")


def run(fatbin: Path, n: int = 100_000) -> None:
    module = kjit.load(fatbin)
    scale_add = module.get_function("scale_add")
    block_sum = module.get_function("block_sum")
    block_sum_cub = module.get_function("block_sum_cub")

    rng = np.random.default_rng(0)
    x = rng.random(n, dtype=np.float32)
    dx = kjit.to_device(x)
    dy = kjit.to_device(np.zeros(n, dtype=np.float32))
    scale_add[kjit.cdiv(n, 256), 256](dx, dy, np.float32(2.0), np.float32(1.0), np.int32(n))
    y = dy.get()
    assert np.allclose(y, 2.0 * x + 1.0), "scale_add gave wrong results"

    blocks = kjit.cdiv(n, TILE)
    dsum = kjit.to_device(np.zeros(blocks, dtype=np.float32))
    block_sum[blocks, TILE](dx, dsum, np.int32(n))
    sums = dsum.get()
    expected = np.add.reduceat(x, np.arange(0, n, TILE))
    assert np.allclose(sums, expected, rtol=1e-5), "block_sum gave wrong results"
    dcub = kjit.to_device(np.zeros(blocks, dtype=np.float32))
    block_sum_cub[blocks, TILE](dx, dcub, np.int32(n))
    assert np.allclose(dcub.get(), expected, rtol=1e-5), "block_sum_cub gave wrong results"
    print(f"ok: scale_add, block_sum and block_sum_cub on {n} elements match numpy "
          f"(total {sums.sum():.3f} vs {x.sum():.3f})")


def main() -> None:
    gpu = driver.available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The installed NVRTC may predate sm_100 (CUDA 12.4-12.7): build for what it supports.
    known = kjit.supported_archs()
    archs = ["native"] * gpu + [a for a in ("sm_80", "sm_90", "sm_100") if a in known]
    parser.add_argument("--arch", default=",".join(archs),
                        help="architectures for kjit build (default: %(default)s)")
    parser.add_argument("-o", "--output", type=Path, default=HERE / "library.fatbin")
    args = parser.parse_args()
    build(args.output, args.arch)
    if not gpu:
        print("no CUDA GPU here: built only; run this script on a GPU machine to launch the kernels")
        return
    run(args.output)


if __name__ == "__main__":
    sys.exit(main())
