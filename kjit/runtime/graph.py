"""kjit's own CUDA graphs: kernel launches captured from a stream or added one by one, replayed
with one host call, and updated in place.

    with kjit.graph() as g:                 # captures on g.stream (current device)
        scale[grid, block](x, n)            # given no stream: the capture stream
        saxpy[grid, block, g.stream](a, x, y, n)
    g.launch()                              # replay (on g.stream, or g.launch(stream))
    g.nodes[1].update(3.0, x, y, n)         # new arguments, no capture again
    g.launch()

A Graph lives in the context of the device current when it is made. Capturing makes its
stream the one launches given none go to, kjit's and PyTorch's and CuPy's (their current
stream, where they are imported), in this thread only (thread-local capture mode). What a
capture cannot record (allocating, host copies, synchronizing, kjit.In/Out) is refused
before it reaches the driver, so the capture survives the refusal.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from .. import driver
from ..errors import ArgumentError, KjitError
from .kernel import Kernel, kernel_for_handle
from .dims import dim3
from .libcuda import c_function, current_context_fn
from .memory import _HostTransfer
from .capture import relaxed_capture, thread_capture
from .stream import Stream, as_handle, capture_hint


class KernelNode:
    """One kernel launch of a Graph. `update(*args, grid=, block=, shared_mem=)` gives it new
    arguments (and geometry) in the executable graph: the next `launch()` runs with them,
    nothing captured again."""

    def __init__(self, graph: "Graph", handle: Any, kernel: Kernel | None, grid: tuple,
                 block: tuple, shared_mem: int):
        self.graph, self.handle, self.kernel = graph, handle, kernel
        self.grid, self.block, self.shared_mem = grid, block, shared_mem
        self._params: Any = None   # its CUDA_KERNEL_NODE_PARAMS, made on first use
        self._dirty = False        # updated since the graph (not its executable) last heard
        if kernel is not None:     # one buffer per node, reused: the driver copies the values
            self._buf, self._ptrs, self._addr = kernel.packer.new_buffers()
            self._fill = kernel.packer.filler(self._buf, c_function("pack"))

    @property
    def name(self) -> str:
        return self.kernel.name if self.kernel is not None else "<a kernel kjit did not load>"

    def update(self, *args: Any, grid: Any = None, block: Any = None,
               shared_mem: int | None = None) -> None:
        kernel = self.kernel
        if kernel is None:
            raise ArgumentError("this graph node runs a kernel kjit did not load; kjit cannot "
                                "pack its arguments")
        self._pack(args)
        p = self._params
        if grid is not None:
            self.grid = p.gridDimX, p.gridDimY, p.gridDimZ = dim3(grid, "grid")
        if block is not None:
            self.block = p.blockDimX, p.blockDimY, p.blockDimZ = dim3(block, "block")
        if shared_mem is not None:
            kernel._check_shared(shared_mem)
            self.shared_mem = p.sharedMemBytes = shared_mem
        self._dirty = True   # the graph takes it when it is instantiated again
        graph = self.graph
        if graph._exec is None:
            return
        if kernel.current_context() == graph._ctx:
            (err,) = _exec_set(graph._exec, self.handle, p)
        else:
            with driver.context_pushed(graph.context):
                (err,) = _exec_set(graph._exec, self.handle, p)
        if err:
            driver.raise_for(err, "cuGraphExecKernelNodeSetParams")

    def _pack(self, args: tuple) -> None:
        """The arguments into this node's buffer, checked as for a launch; its params made
        on first use."""
        for a in args:
            if isinstance(a, _HostTransfer):
                raise ArgumentError(
                    f"kernel {self.name!r}: kjit.In/Out/InOut copy host arrays around a launch, "
                    "which a graph node cannot; pass device arrays")
        self._fill(args, [])
        if self._params is None:
            p = self._params = driver.bindings().CUDA_KERNEL_NODE_PARAMS()
            p.func = self.kernel.handle
            p.gridDimX, p.gridDimY, p.gridDimZ = self.grid
            p.blockDimX, p.blockDimY, p.blockDimZ = self.block
            p.sharedMemBytes = self.shared_mem
            p.kernelParams = self._addr

    def _sync_graph(self) -> None:
        """Give the graph the node's present parameters (before it is instantiated again)."""
        if self._dirty:
            driver.call(driver.bindings().cuGraphKernelNodeSetParams, self.handle, self._params)
            self._dirty = False

    def __repr__(self) -> str:
        return f"kjit.KernelNode({self.name}, grid={self.grid}, block={self.block})"


def _exec_set(exec_: Any, node: Any, params: Any) -> tuple:
    return driver.bindings().cuGraphExecKernelNodeSetParams(exec_, node, params)


class Graph:
    """A CUDA graph of kernel launches on one device (the current one when it is made)."""

    def __init__(self) -> None:
        self.context = driver.ensure_context()
        self._ctx = int(self.context)
        self._current = current_context_fn()
        self._epoch = driver.context_epoch(self.context)
        self.device = driver.current_device()
        self.handle = driver.call(driver.bindings().cuGraphCreate, 0)
        self._exec: Any = None
        self.nodes: list[KernelNode] = []
        self._stream: Stream | None = None

    @property
    def stream(self) -> Stream:
        """The graph's own stream (non-blocking, made on first use): capture and replay go
        there unless another stream is named."""
        if self._stream is None:
            with driver.context_pushed(self.context):
                self._stream = Stream(non_blocking=True)
        return self._stream

    # --- making it ------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self, stream: Any = None) -> Iterator["Graph"]:
        """Record the launches made in this block on `stream` (default: the graph's own) and
        add them to the graph, in order after what it holds."""
        if self.nodes or self._exec is not None:
            raise KjitError("this graph already holds launches; capture into a new kjit.Graph()")
        handle = as_handle(stream) if stream is not None else self.stream.handle
        if int(handle) in (0, 1, 2):
            raise ArgumentError("a capture needs a stream of its own, not the legacy or "
                                "per-thread default stream: name one, or let the graph use its own")
        drv = driver.bindings()
        # the frameworks' current stream is set before the capture begins: PyTorch's first
        # use of CUDA in a process initialises it, which a capture cannot record
        with driver.context_pushed(self.context), _framework_streams(int(handle), self.device):
            driver.call(drv.cuStreamBeginCapture, handle,
                        drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            try:
                with thread_capture(int(handle), "a kjit graph"):
                    yield self
            except BaseException:
                err, graph = drv.cuStreamEndCapture(handle)   # the stream leaves capture mode
                if not err and int(graph):
                    drv.cuGraphDestroy(graph)
                raise
            err, graph = drv.cuStreamEndCapture(handle)
            if err:
                driver.raise_for(err, "cuStreamEndCapture",
                                 "the capture was ended by a call it could not record")
            driver.call(drv.cuGraphDestroy, self.handle)
            self.handle = graph
            self.nodes = self._kernel_nodes()

    def add(self, kernel: Any, grid: Any, block: Any, *args: Any, shared_mem: int = 0,
            after: "KernelNode | list[KernelNode] | None" = None) -> KernelNode:
        """Add a launch of `kernel` (a Kernel, or an @kjit.kernel function: its kernel on the
        graph's device) without capturing; it runs after the nodes in `after` (default: the
        last node added, so nodes added one by one run in order)."""
        kernel = _kernel_on(kernel, self)
        kernel._check_shared(shared_mem)
        node = KernelNode(self, None, kernel, dim3(grid, "grid"), dim3(block, "block"),
                          shared_mem)
        node._pack(args)
        deps = [n.handle for n in (after if isinstance(after, list) else [after])] \
            if after is not None else ([self.nodes[-1].handle] if self.nodes else [])
        with driver.context_pushed(self.context):
            node.handle = driver.call(driver.bindings().cuGraphAddKernelNode, self.handle, deps,
                                      len(deps), node._params)
        self.nodes.append(node)
        self._drop_exec()   # a new node changes the graph: instantiated again on launch
        return node

    def _kernel_nodes(self) -> list[KernelNode]:
        drv = driver.bindings()
        count = _node_count(self.handle)
        if not count:
            return []
        handles, _n = driver.call(drv.cuGraphGetNodes, self.handle, count)
        nodes = []
        for h in handles[:count]:
            if driver.call(drv.cuGraphNodeGetType, h) != drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                continue
            p = driver.call(drv.cuGraphKernelNodeGetParams, h)
            nodes.append(KernelNode(self, h, kernel_for_handle(int(p.func)),
                                    (p.gridDimX, p.gridDimY, p.gridDimZ),
                                    (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes))
        return nodes

    # --- running it -----------------------------------------------------------------------
    def launch(self, stream: Any = None) -> None:
        """Replay every launch of the graph, in one host call, on `stream` (default: the
        graph's own stream; any stream of the graph's device)."""
        if self._exec is None:
            self._instantiate()
        handle = self._stream_handle if stream is None else int(as_handle(stream))
        if self._current() == self._ctx:
            err = self._replay(self._exec_handle, handle)
        else:
            with driver.context_pushed(self.context):
                err = self._replay(self._exec_handle, handle)
        if err:
            driver.raise_for(err, "cuGraphLaunch", capture_hint(err, handle) or "")

    def _instantiate(self) -> None:
        drv = driver.bindings()
        with driver.context_pushed(self.context):
            for node in self.nodes:
                node._sync_graph()
            self._exec = driver.call(drv.cuGraphInstantiate, self.handle, 0)
        self._exec_handle = int(self._exec)
        self._stream_handle = int(self.stream.handle)
        launch = c_function("graph_launch")
        if launch is None:   # no C extension: cuda.bindings' call
            def launch(exec_: int, stream: int) -> int:
                return int(drv.cuGraphLaunch(drv.CUgraphExec(exec_), drv.CUstream(stream))[0])
        self._replay = launch

    def synchronize(self) -> None:
        """Wait for the graph's own stream."""
        self.stream.synchronize()

    def _drop_exec(self) -> None:
        if self._exec is not None:
            # relaxed: a graph collected while a capture runs must not end it
            with driver.context_pushed(self.context), relaxed_capture():
                driver.bindings().cuGraphExecDestroy(self._exec)
            self._exec = None

    def close(self) -> None:
        if self.handle is not None and driver.context_epoch(self.context) == self._epoch:
            self._drop_exec()
            with relaxed_capture():
                driver.bindings().cuGraphDestroy(self.handle)
        self.handle = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"kjit.Graph(device={self.device}, nodes={[n.name for n in self.nodes]})"


def _node_count(graph: Any) -> int:
    err, _nodes, count = driver.bindings().cuGraphGetNodes(graph, 0)
    if err:
        driver.raise_for(err, "cuGraphGetNodes")
    return int(count)


def _kernel_on(kernel: Any, graph: Graph) -> Kernel:
    """The Kernel a node of `graph` launches: a Kernel of the graph's device, or the kernel of
    an @kjit.kernel function (or of a Kernel's module) loaded there."""
    with driver.context_pushed(graph.context):
        if isinstance(kernel, Kernel):
            return kernel if kernel.context_address == int(graph.context) else \
                kernel.module.get_function(kernel.name)
        getter = getattr(kernel, "kernel", None)
        if callable(getter):
            return getter()
    raise ArgumentError(f"Graph.add takes a kjit.Kernel or an @kjit.kernel function, got "
                        f"{type(kernel).__name__}")


@contextlib.contextmanager
def _framework_streams(handle: int, device: int) -> Iterator[None]:
    """PyTorch's and CuPy's current stream made the capture stream (where they are imported),
    so their launches and kjit launches on their arrays given no stream are recorded too."""
    with contextlib.ExitStack() as stack:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            stack.enter_context(torch.cuda.stream(
                torch.cuda.ExternalStream(handle, device=torch.device("cuda", device))))
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            stack.enter_context(cupy.cuda.ExternalStream(handle))
        yield


@contextlib.contextmanager
def graph(stream: Any = None) -> Iterator[Graph]:
    """`with kjit.graph() as g:` makes a Graph on the current device and captures the block
    into it (see Graph.capture)."""
    g = Graph()
    with g.capture(stream):
        yield g
