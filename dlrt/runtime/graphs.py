"""All CUDA graph capture: the host-loop parts and the block graph with a WHILE node.

torch has no API for conditional graph nodes (CUDA >= 12.4), so the block graph is assembled
here with `cuda.bindings`:

    begin (child graph) -> WHILE(handle) { round (child graph) } -> commit (child graph)

Each part is captured by torch (`torch.cuda.graph(keep_graph=True)`, so torch's memory pool and
allocator stay in charge) and nested as a child graph. The loop condition is set on the GPU by
`csrc/graph_cond.cu` (shipped in the package as `dlrt/csrc`), a one-thread kernel that copies a
device flag into the node's conditional handle; it is compiled on first use (NVRTC from
cuda-bindings, else nvcc: `dlrt.kernels.compiler`) into the dlrt cache and launched through the
driver API, so it is captured like any other kernel; `device_loop_missing` says beforehand
whether that can work here. All capture mechanics live in this module.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from dlrt.kernels.compiler import MIN_CUDA, driver_version, install_hint, missing_compiler
from dlrt.kernels.cubin import Kernel
from dlrt.kernels.cubin import check as _check

_cond_kernel = None


def device_loop_missing() -> str | None:
    """None when the device loop can run here; else what is missing and how to get it.

    It needs cuda-bindings (the graph API), where a driver is loaded a driver of CUDA >= 12.4,
    and a compiler of CUDA >= 12.4 for csrc/graph_cond.cu whose major version is at most the
    driver's (NVRTC, else nvcc: `find_compiler` skips one whose CUBINs would not load). Needs
    no GPU: without a driver only the first and the last are checked.
    """
    try:
        from cuda.bindings import driver, runtime  # noqa: F401
    except ImportError:
        return f"cuda-bindings is not installed; {install_hint()}"
    have = driver_version()
    if have is not None and have < MIN_CUDA:
        return (f"the NVIDIA driver supports CUDA {have[0]}.{have[1]}, older than "
                f"{MIN_CUDA[0]}.{MIN_CUDA[1]} (conditional graph nodes); update the driver")
    return missing_compiler()


class _CondKernel:
    """The loaded `dlrt_set_condition(handle, flag)` kernel (csrc/graph_cond.cu)."""

    def __init__(self):
        self._kernel = Kernel("graph_cond.cu", "dlrt_set_condition", "the device loop",
                              "or use execution_mode='host_loop'")

    def launch(self, handle, flag: torch.Tensor) -> None:
        """Enqueue on torch's current stream (captured when a capture is running)."""
        assert flag.dtype == torch.int32 and flag.is_cuda
        self._kernel.launch(1, 1, (int(handle), flag.data_ptr()),
                            (ctypes.c_uint64, ctypes.c_void_p))


def cond_kernel() -> _CondKernel:
    global _cond_kernel
    if _cond_kernel is None:
        _cond_kernel = _CondKernel()
    return _cond_kernel


def capture_parts(fns: list[Callable[[], None]], pool) -> list[torch.cuda.CUDAGraph]:
    """Capture each function as its own replayable torch CUDA graph (host-loop mode)."""
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            fn()
        graphs.append(g)
    return graphs


class WhileGraph:
    """begin -> WHILE(flag) { body } -> end, instantiated once, launched per block.

    `begin`, `body` and `end` are Python functions of pure tensor code on static buffers.
    `flag` is a device int32 [1] that `begin` and `body` set: nonzero = run (another) round.
    """

    def __init__(self, begin: Callable[[], None], body: Callable[[], None],
                 end: Callable[[], None], flag: torch.Tensor, pool=None):
        from cuda.bindings import runtime as cudart

        self._rt = cudart
        kernel = cond_kernel()
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graph = _check(cudart.cudaGraphCreate(0))
        self.handle = _check(cudart.cudaGraphConditionalHandleCreate(self.graph, 0, 0))

        def with_flag(fn):
            def run():
                fn()
                kernel.launch(self.handle, flag)
            return run

        self._parts = [self._capture(with_flag(begin)), self._capture(with_flag(body)),
                       self._capture(end)]
        begin_g, body_g, end_g = (p.raw_cuda_graph() for p in self._parts)
        n_begin = _check(cudart.cudaGraphAddChildGraphNode(self.graph, None, 0, begin_g))
        params = cudart.cudaGraphNodeParams()
        params.type = cudart.cudaGraphNodeType.cudaGraphNodeTypeConditional
        params.conditional.handle = self.handle
        params.conditional.type = cudart.cudaGraphConditionalNodeType.cudaGraphCondTypeWhile
        params.conditional.size = 1
        n_while = _check(cudart.cudaGraphAddNode(self.graph, [n_begin], None, 1, params))
        loop_body = params.conditional.phGraph_out[0]
        _check(cudart.cudaGraphAddChildGraphNode(loop_body, None, 0, body_g))
        _check(cudart.cudaGraphAddChildGraphNode(self.graph, [n_while], 1, end_g))
        self.exec = _check(cudart.cudaGraphInstantiate(self.graph, 0))
        # NOTE: upload once now, so launches do not pay for it.
        _check(cudart.cudaGraphUpload(self.exec, torch.cuda.current_stream().cuda_stream))

    def _capture(self, fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g, pool=self.pool):
            fn()
        return g

    def launch(self) -> None:
        """Run begin, the rounds, and end on torch's current stream (asynchronous)."""
        stream = torch.cuda.current_stream().cuda_stream
        _check(self._rt.cudaGraphLaunch(self.exec, stream))

    def close(self) -> None:
        """Destroy the instantiated and the assembled graph and release the captured parts
        (call when the device no longer runs it)."""
        if self.exec is None:
            return
        _check(self._rt.cudaGraphExecDestroy(self.exec))
        _check(self._rt.cudaGraphDestroy(self.graph))
        for part in self._parts:
            part.reset()
        self.exec = self.graph = None
        self._parts = []


def node_types(graph: torch.cuda.CUDAGraph) -> dict[str, int]:
    """Node count per node type of a captured graph kept with `keep_graph=True`
    (e.g. {'Kernel': 310, 'Memcpy': 4}): what a WHILE body launches every round."""
    from cuda.bindings import runtime as cudart

    raw = graph.raw_cuda_graph()
    _, count = _check(cudart.cudaGraphGetNodes(raw, 0))
    nodes, _ = _check(cudart.cudaGraphGetNodes(raw, count))
    out: dict[str, int] = {}
    for node in nodes:
        name = _check(cudart.cudaGraphNodeGetType(node)).name.replace("cudaGraphNodeType", "")
        out[name] = out.get(name, 0) + 1
    return out
