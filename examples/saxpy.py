"""saxpy with @kjit.kernel: a Python float reaches a `float` parameter as 2.0f, n as int32."""
import numpy as np

import kjit


@kjit.kernel
def saxpy():
    return r'''
    extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }'''


def main() -> None:
    n = 1 << 20
    xh = np.random.default_rng().standard_normal(n).astype(np.float32)
    x, y = kjit.to_device(xh), kjit.zeros(n, np.float32)
    saxpy[kjit.cdiv(n, 256), 256](2.0, x, y, n)
    np.testing.assert_allclose(y.get(), 2.0 * xh, rtol=1e-6)
    print("saxpy ok:", y.get()[:4])


if __name__ == "__main__":
    main()
