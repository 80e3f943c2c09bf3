"""A kernel reading __constant__ memory that the host fills through Module.get_global."""
import numpy as np

import kjit

SRC = r'''
__constant__ float coeffs[4];
extern "C" __global__ void cubic(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = ((coeffs[3] * x[i] + coeffs[2]) * x[i] + coeffs[1]) * x[i] + coeffs[0];
}'''


def main() -> None:
    mod = kjit.load(kjit.compile(SRC), jit_options=kjit.JitOptions(optimization_level=3))
    coeffs = np.array([1.0, -2.0, 0.5, 0.25], np.float32)
    mod.get_global("coeffs").copy_from_host(coeffs)
    n = 4096
    xh = np.linspace(-2, 2, n, dtype=np.float32)
    y = kjit.empty(n, np.float32)
    k = mod.get_function("cubic")
    k[kjit.cdiv(n, 256), 256](kjit.to_device(xh), y, n)
    np.testing.assert_allclose(y.get(), np.polyval(coeffs[::-1], xh), rtol=1e-5, atol=1e-5)
    print("constant memory ok; registers:", k.attributes.num_regs)


if __name__ == "__main__":
    main()
