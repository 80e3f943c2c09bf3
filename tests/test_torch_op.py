"""PyTorch integration that needs no GPU: operator schemas from C signatures, the fake
implementation under torch.compile(fullgraph=True), errors for CPU / mistyped / strided
tensors naming the parameter, the stream rule for mixed frameworks, and torch.compile never
tracing into kjit (a graph break naming the operator route instead of a crash)."""
from __future__ import annotations

import os

import pytest

import kjit
from kjit.errors import ArgumentError
from kjit.runtime import stream as stream_mod
from kjit.runtime.cdecl import parse_signatures
from kjit.runtime.slots import ParamSlot
from kjit.runtime.torch_op import operator_params, schema

SOURCE = r'''
struct Pair { float a; int b; };
extern "C" __global__ void many(const float* x, float* y, double* z, int n, unsigned m,
                                long long big, size_t count, float a, double b, bool flag,
                                const int* __restrict__ idx) {}
extern "C" __global__ void with_struct(float* y, Pair p) {}
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void scale(const float* x, float* y, float s, int n) {}
'''


def _slots(name):
    sig = parse_signatures(SOURCE)[name]
    return [ParamSlot(i, p.name, 0, p.ctype.size, p.ctype) for i, p in enumerate(sig.params)]


def test_schema_comes_from_the_c_signature():
    params = operator_params(_slots("many"), "many", None)
    assert schema(params) == (
        "(Tensor x, Tensor(a!) y, Tensor(b!) z, SymInt n, SymInt m, SymInt big, SymInt count, "
        "float a, float b, bool flag, Tensor idx) -> ()")
    outs = operator_params(_slots("many"), "many", {"y": "x", "z": "x"})
    assert schema(outs) == (
        "(Tensor x, SymInt n, SymInt m, SymInt big, SymInt count, float a, float b, bool flag, "
        "Tensor idx) -> (Tensor, Tensor)")
    assert schema(operator_params(_slots("scale"), "scale", {"y": "x"})) == \
        "(Tensor x, float s, SymInt n) -> Tensor"


def test_parameters_an_operator_cannot_take_are_named():
    with pytest.raises(ArgumentError, match=r"parameter 1 'p' \(struct Pair\).*no PyTorch operator type"):
        operator_params(_slots("with_struct"), "with_struct", None)
    with pytest.raises(ArgumentError, match=r"'x'.*points to const.*cannot be an output"):
        operator_params(_slots("scale"), "scale", {"x": "y"})
    with pytest.raises(ArgumentError, match=r"outputs names \['out'\], which are not its parameters"):
        operator_params(_slots("scale"), "scale", {"out": "x"})


def _kernel(name):
    return kjit.kernel(lambda: SOURCE, name=name)


def test_a_kernel_becomes_an_operator_that_compiles_without_graph_breaks():
    torch = pytest.importorskip("torch")
    axpy = _kernel("saxpy").as_torch_op("kjit_cpu_test::saxpy", grid=lambda a, x, y, n: (n // 256 + 1,),
                                        block=256)
    sc = _kernel("scale").as_torch_op("kjit_cpu_test::scale", grid=(4,), block=256, outputs={"y": "x"})
    assert str(axpy._schema) == "kjit_cpu_test::saxpy(float a, Tensor x, Tensor(a!) y, SymInt n) -> ()"
    assert str(sc._schema) == "kjit_cpu_test::scale(Tensor x, float s, SymInt n) -> Tensor"

    def f(x, y):
        axpy(2.0, x, y, x.numel())
        return sc(y, 3.0, y.numel()) + 1

    # meta tensors run the fake implementation: tracing does no GPU work (there is no GPU here)
    x, y = torch.ones(1000, device="meta"), torch.ones(1000, device="meta")
    explain = torch._dynamo.explain(f)(x, y)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    out = torch.compile(f, fullgraph=True, backend="eager")(x, y)
    assert out.shape == (1000,) and out.device.type == "meta" and out.dtype == torch.float32
    # the same name with the same schema re-targets the operator; another schema is refused
    again = _kernel("saxpy").as_torch_op("kjit_cpu_test::saxpy", grid=(1,), block=32)
    assert again is axpy
    with pytest.raises(ArgumentError, match="already defined with schema"):
        _kernel("scale").as_torch_op("kjit_cpu_test::saxpy", grid=(1,), block=32)
    with pytest.raises(ArgumentError, match="namespace::name"):
        _kernel("saxpy").as_torch_op("saxpy", grid=(1,), block=32)


def test_operator_refuses_cpu_and_mistyped_tensors_naming_the_parameter():
    torch = pytest.importorskip("torch")
    op = _kernel("saxpy").as_torch_op("kjit_cpu_test::saxpy_err", grid=(1,), block=32)
    with pytest.raises(ArgumentError, match=r"parameter 1 'x' \(const float\*\): got a tensor on cpu.*"
                                            r"x\.to\('cuda:0'\)"):
        op(2.0, torch.ones(8), torch.ones(8), 8)
    with pytest.raises(ArgumentError, match=r"parameter 1 'x' \(const float\*\): got a tensor on cpu"):
        op(2.0, torch.ones(8).to_sparse(), torch.ones(8), 8)   # PyTorch's SparseCPU backend
    meta = torch.ones(8, device="meta")
    with pytest.raises(ArgumentError, match=r"'x'.*holds torch\.float64.*reads float32.*"
                                            r"x\.to\(torch\.float32\)"):
        op(2.0, meta.double(), meta, 8)
    with pytest.raises(ArgumentError, match=r"'y'.*not C-contiguous.*x\.contiguous\(\)"):
        op(2.0, meta, torch.ones(8, 2, device="meta").t()[0], 8)
    # under torch.compile the fake implementation refuses at trace time, before any launch
    with pytest.raises(Exception, match=r"'x'.*holds torch\.float64"):
        torch.compile(lambda a, b: op(2.0, a, b, 8), backend="eager", fullgraph=True)(meta.double(), meta)


def test_a_launch_converter_refuses_wrong_tensors_without_a_driver():
    torch = pytest.importorskip("torch")
    from kjit.runtime.params import convert
    slot = _slots("saxpy")[1]
    for value, pattern in [
            (torch.ones(8), r"parameter 1 'x' \(const float\*\): got a tensor on cpu \(torch\.float32\)"),
            (torch.ones(8, dtype=torch.int32, device="meta"), "got a tensor on meta"),
            (torch.ones(8, requires_grad=True), "on cpu")]:
        with pytest.raises(ArgumentError, match=pattern):
            convert(slot, value, 0, [])


def test_mixed_frameworks_follow_one_stream_or_are_refused(monkeypatch):
    torch = pytest.importorskip("torch")

    class CupyLike:   # a CuPy array, as far as the stream rule can tell
        __module__ = "cupy._core.core"
        __cuda_array_interface__ = {}

    streams = {stream_mod.TORCH: 0x10, stream_mod.CUPY: 0x10}
    monkeypatch.setattr(stream_mod, "current_stream", lambda kind, device: streams[kind])
    t, c = torch.ones(2), CupyLike()
    assert stream_mod.framework_stream((1.0, t, 3), 0, "k") == 0x10
    assert stream_mod.framework_stream((c,), 0, "k") == 0x10
    assert stream_mod.framework_stream((t, c), 0, "k") == 0x10   # the same stream: fine
    assert stream_mod.framework_stream((1.0, kjit.ptr(8), 3), 0, "k") == 0   # kjit's: legacy
    streams[stream_mod.CUPY] = 0x20
    with pytest.raises(ArgumentError, match=r"kernel 'k' receives PyTorch tensors and CuPy arrays.*"
                                            r"0x10.*0x20.*k\[grid, block, stream\]"):
        stream_mod.framework_stream((t, c), 0, "k")


def test_torch_compile_never_traces_into_a_kjit_launch():
    """A launch inside a compiled function is a graph break naming the operator route, and
    kjit's Python launch path then runs eagerly: Dynamo tracing it would crash on values it
    cannot model (torch's DLPack device enum, read by kjit's argument checks)."""
    torch = pytest.importorskip("torch")
    from kjit.runtime import pointers, torch_compile
    from kjit.runtime.kernel import Kernel

    seen = []
    names = {"foreign_device": pointers.foreign_device, "seen": seen}
    inside = os.path.join(torch_compile.PACKAGE_DIR, "runtime", "<a launcher>")   # a kjit file
    exec(compile("def launch(x, n):\n    seen.append(foreign_device(x, 0))\n", inside, "exec"), names)
    k = Kernel.__new__(Kernel)   # a kernel with one configured launcher, no GPU needed
    k._configs = {(1, 32): torch_compile.launch_entry(names["launch"])}

    def f(x):
        y = x + 1
        k[1, 32](y, 3)
        return y * 2

    torch._dynamo.reset()
    out = torch.compile(f, backend="eager")(torch.ones(3))
    assert out.tolist() == [4.0, 4.0, 4.0] and seen == [None]   # the launch ran, eagerly
    explain = torch._dynamo.explain(f)(torch.ones(3))
    assert explain.graph_break_count >= 1
    assert any("as_torch_op" in str(r) for r in explain.break_reasons), explain.break_reasons
    with pytest.raises(Exception, match="as_torch_op"):
        torch.compile(f, backend="eager", fullgraph=True)(torch.ones(3))


def test_an_array_in_host_memory_is_named_with_its_parameter():
    from kjit.runtime.params import convert

    class HostArray:   # a DLPack producer whose memory is on the CPU (JAX, TensorFlow...)
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):
            raise AssertionError("not read: the device is refused first")

    with pytest.raises(ArgumentError, match=r"parameter 1 'x' \(const float\*\): got a HostArray "
                                            r"in CPU memory.*copy it to the GPU"):
        convert(_slots("saxpy")[1], HostArray(), 0, [])


@pytest.mark.parametrize("order", ["kjit first", "dynamo first"])
def test_dynamo_skips_kjit_whichever_is_imported_first(order):
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from pathlib import Path
    imports = ["import kjit.decorator, kjit.runtime.kernel", "import torch._dynamo"]
    code = "\n".join((imports if order == "kjit first" else imports[::-1]) + [
        "from torch._dynamo import trace_rules",
        "import kjit, inspect",
        "from kjit.runtime.kernel import Kernel",
        "from kjit.decorator import KernelFunction",
        "f = inspect.getsourcefile(kjit.runtime.kernel)",
        "print(trace_rules.check_file(f).skipped, trace_rules.check_file(",
        "      inspect.getsourcefile(kjit.runtime.params)).skipped,",
        "      getattr(Kernel.__getitem__, '_torchdynamo_disable', False),",
        "      getattr(KernelFunction.__getitem__, '_torchdynamo_disable', False))"])
    root = str(Path(kjit.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.stdout.split() == ["True"] * 4, res.stdout + res.stderr
