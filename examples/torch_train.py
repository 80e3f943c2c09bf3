"""Train a tiny model under torch.compile whose middle layer is a kjit kernel with a backward.

The layer, y = leaky_relu(x * w + b) per feature, is two CUDA kernels made PyTorch operators
with `as_torch_op`: the forward, and the elementwise part of the backward. Their schemas come
from the kernels' C signatures; `torch.library.register_autograd` ties them together, and
torch.compile(fullgraph=True) compiles the model, forward and backward, with no graph break."""
import torch

import kjit

SLOPE = 0.1


@kjit.kernel
def affine_leaky():
    return r'''
    extern "C" __global__ void affine_leaky(const float* x, const float* w, const float* b,
                                            float* y, int rows, int cols, float slope) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= rows * cols) return;
        float pre = x[i] * w[i % cols] + b[i % cols];
        y[i] = pre > 0.f ? pre : slope * pre;
    }'''


@kjit.kernel
def affine_leaky_grad():
    # the gradient at the pre-activation (g) and at the input (gx = g * w)
    return r'''
    extern "C" __global__ void affine_leaky_grad(const float* gy, const float* x, const float* w,
                                                 const float* b, float* g, float* gx,
                                                 int rows, int cols, float slope) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= rows * cols) return;
        float pre = x[i] * w[i % cols] + b[i % cols];
        g[i] = pre > 0.f ? gy[i] : slope * gy[i];
        gx[i] = g[i] * w[i % cols];
    }'''


def _grid(*args):
    rows, cols = args[-3], args[-2]
    return (kjit.cdiv(rows * cols, 256),)


# y and (g, gx) are allocated by the operators, like x and gy
forward = affine_leaky.as_torch_op("kjit_example::affine_leaky", grid=_grid, block=256,
                                   outputs={"y": "x"})
backward_op = affine_leaky_grad.as_torch_op("kjit_example::affine_leaky_grad", grid=_grid,
                                            block=256, outputs={"g": "gy", "gx": "gy"})


def setup_context(ctx, inputs, output):
    x, w, b, rows, cols, slope = inputs
    ctx.save_for_backward(x, w, b)
    ctx.shape = (rows, cols, slope)


def backward(ctx, gy):
    x, w, b = ctx.saved_tensors
    rows, cols, slope = ctx.shape
    g, gx = backward_op(gy.contiguous(), x, w, b, rows, cols, slope)
    return gx, (g * x).sum(0), g.sum(0), None, None, None


torch.library.register_autograd("kjit_example::affine_leaky", backward, setup_context=setup_context)


class AffineLeaky(torch.nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(features))
        self.b = torch.nn.Parameter(torch.zeros(features))

    def forward(self, x):
        return forward(x.contiguous(), self.w, self.b, x.shape[0], x.shape[1], SLOPE)


def reference(x, w, b):
    return torch.nn.functional.leaky_relu(x * w + b, SLOPE)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 32, device="cuda", requires_grad=True)
    layer = AffineLeaky(32).cuda()
    with torch.no_grad():
        layer.w.uniform_(-1, 1)
        layer.b.uniform_(-0.5, 0.5)
    # the kernel's forward and backward agree with PyTorch's own
    y = layer(x)
    torch.testing.assert_close(y, reference(x, layer.w, layer.b))
    grads = torch.autograd.grad(y.square().sum(), (x, layer.w, layer.b))
    expect = torch.autograd.grad(reference(x, layer.w, layer.b).square().sum(), (x, layer.w, layer.b))
    for got, want in zip(grads, expect):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    model = torch.nn.Sequential(torch.nn.Linear(8, 32), AffineLeaky(32), torch.nn.Linear(32, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(256, 8, device="cuda")
    target = (data[:, :1] * 2 - data[:, 1:2]).tanh()

    compiled = torch.compile(model, fullgraph=True)   # forward and backward graphs, no breaks

    losses = []
    for _ in range(200):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert losses[-1] < 0.5 * losses[0], losses[::20]
    print("ok")


if __name__ == "__main__":
    main()
