"""kjit kernels on PyTorch tensors and CuPy arrays (through __cuda_array_interface__),
launched on the framework's own stream."""
import numpy as np

import kjit


@kjit.kernel
def relu():
    return r'''
    extern "C" __global__ void relu(const float* x, float* y, long long n) {
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }'''


def main() -> None:
    n = 1 << 16
    try:
        import torch
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        relu[kjit.cdiv(n, 256), 256, torch.cuda.current_stream()](x, y, n)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x))
        print("torch ok")
    except ImportError:
        print("torch not installed")
    try:
        import cupy as cp
        x = cp.asarray(np.random.default_rng().standard_normal(n).astype(np.float32))
        y = cp.empty_like(x)
        relu[kjit.cdiv(n, 256), 256, cp.cuda.get_current_stream()](x, y, n)
        cp.cuda.get_current_stream().synchronize()
        assert bool((y == cp.maximum(x, 0)).all())
        print("cupy ok")
    except ImportError:
        print("cupy not installed")


if __name__ == "__main__":
    main()
