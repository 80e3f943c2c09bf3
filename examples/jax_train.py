"""Train with jax.grad through two kjit kernels: a forward and its backward, tied by
jax.custom_vjp, all inside jax.jit. No C++ is built: kjit compiles the CUDA source (or finds it
in its cache) and XLA calls it through the FFI handler kjit ships (docs/jax.md).

The layer is softplus, y = log(1 + e^x); its derivative is the logistic function. The model
y = softplus(w * x) is fitted to data made with w = 2 by gradient descent on w."""
import jax
import jax.numpy as jnp

import kjit


@kjit.kernel
def softplus_fwd():
    return r'''
    extern "C" __global__ void softplus_fwd(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 20.f ? x[i] : log1pf(expf(x[i]));
    }'''


@kjit.kernel
def softplus_bwd():
    # dy/dx = 1 / (1 + e^-x), times the incoming gradient
    return r'''
    extern "C" __global__ void softplus_bwd(const float* x, const float* gy, float* gx, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) gx[i] = gy[i] / (1.f + expf(-x[i]));
    }'''


def _grid(*args):
    return (kjit.cdiv(args[-1], 256),)   # n, the last parameter of both kernels


fwd_op = softplus_fwd.as_jax_op(grid=_grid, block=256, outputs={"y": "x"})
bwd_op = softplus_bwd.as_jax_op(grid=_grid, block=256, outputs={"gx": "x"})


@jax.custom_vjp
def smooth_relu(x):
    return fwd_op(x, x.size)


def _fwd(x):
    return smooth_relu(x), x   # the residual: the input


def _bwd(x, gy):
    return (bwd_op(x, gy, x.size),)


smooth_relu.defvjp(_fwd, _bwd)


def train(steps: int = 100, lr: float = 0.5) -> tuple[float, float]:
    """Fit w; returns the loss before and after."""
    x = jnp.linspace(-2, 2, 4096, dtype=jnp.float32)
    target = jax.nn.softplus(2.0 * x)

    def loss(w):
        return jnp.mean((smooth_relu(w * x) - target) ** 2)

    step = jax.jit(lambda w: w - lr * jax.grad(loss)(w))
    w = jnp.float32(0.5)
    first = float(loss(w))
    for _ in range(steps):
        w = step(w)
    return first, float(loss(w))


if __name__ == "__main__":
    first, last = train()
    assert last < first * 0.01, (first, last)
    print(f"loss {first:.4f} -> {last:.6f}: ok")
