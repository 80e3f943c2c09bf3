"""A templated kernel instantiated through name expressions; kjit reads each instance's
parameter types from its mangled name, so 0.5 arrives as float in one and double in the other."""
import numpy as np

import kjit

SRC = r'''
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}'''


def main() -> None:
    obj = kjit.compile(SRC, name_expressions=["axpy<float>", "axpy<double>"])
    print("lowered names:", dict(obj.symbols))
    mod = kjit.load(obj)
    n = 1000
    for expr, dtype in (("axpy<float>", np.float32), ("axpy<double>", np.float64)):
        k = mod.get_function(expr)
        xh = np.arange(n, dtype=dtype)
        y = kjit.zeros(n, dtype)
        k[kjit.cdiv(n, 128), 128](0.5, kjit.to_device(xh), y, n)
        np.testing.assert_allclose(y.get(), 0.5 * xh)
        print(expr, "ok", k)


if __name__ == "__main__":
    main()
