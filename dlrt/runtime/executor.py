"""Runs a block program in one of three execution modes (one decoding contract):

- `eager`: the begin phase, then rounds from Python until the device flag says stop (one host
  sync per round), then end. The only mode on the CPU.
- `host_loop`: the begin phase, round and end each captured as a CUDA graph; the host replays
  the round graph and reads the flag after each (the classic design: one sync per round).
- `device_loop`: one CUDA graph per block, begin -> WHILE(flag) { round } -> end, launched once;
  the GPU repeats the rounds (`dlrt.runtime.graphs.WhileGraph`).

The three run the same tensor code on the same static buffers, so they commit the same tokens.
Graphs are captured on first use per (program, begin phase, mode) and kept in a bounded cache
(`MAX_GRAPHS`; the least recently used are freed). The attention backend's host hooks
(`plan_block`, `end_block`) are called here and nowhere else.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict

import torch

from dlrt.attention.base import AttentionBackend
from dlrt.errors import OptionError
from dlrt.runtime import graphs

log = logging.getLogger(__name__)

MODES = ("device_loop", "host_loop", "eager")
MAX_GRAPHS = 16


def check_mode(mode: str, device: torch.device) -> str:
    """Return `mode` if it can run on `device`.

    Raises:
        OptionError: not one of MODES; a graph mode off CUDA; device_loop where its kernel
            cannot be built or run (names what is missing: `graphs.device_loop_missing`).
    """
    if mode not in MODES:
        raise OptionError(f"execution_mode {mode!r} is not one of {MODES}")
    if mode != "eager" and device.type != "cuda":
        raise OptionError(f"execution_mode {mode!r} needs a CUDA device; use 'eager' on "
                          f"{device.type}")
    if mode == "device_loop":
        missing = graphs.device_loop_missing()
        if missing is not None:
            raise OptionError(f"execution_mode 'device_loop' cannot run here: {missing}; or "
                              "use 'host_loop'")
    return mode


def resolve_mode(mode: str, device: torch.device) -> str:
    """The execution mode `mode` ("auto" or one of MODES) means on `device`: auto is eager on
    the CPU; on CUDA device_loop where it can run here, else host_loop, with one warning
    (logging, once per process) naming what is missing and how to get it.

    Raises:
        OptionError: as `check_mode`.
    """
    if mode == "auto" and device.type != "cuda":
        mode = "eager"
    elif mode == "auto":
        missing = graphs.device_loop_missing()
        mode = "device_loop" if missing is None else "host_loop"
        if missing is not None:
            _warn_host_loop(missing)
    return check_mode(mode, device)


@functools.cache
def _warn_host_loop(missing: str) -> None:
    log.warning("execution_mode auto: host_loop (a CUDA graph per round) instead of "
                "device_loop, which cannot run here: %s", missing)


def warm_up(program, begin, saved: list[torch.Tensor]) -> None:
    """Run `begin`, a round and `end` once outside capture (Triton compiles, cuBLAS picks its
    kernels), then put back every buffer the program mutates (`saved`: clones of
    `program.buffers()` taken before), so the warm-up leaves no trace in the next block."""
    begin()
    program.round()
    program.end()
    for t, s in zip(program.buffers(), saved, strict=True):
        t.copy_(s)


class Executor:
    def __init__(self, mode: str, device: torch.device, backend: AttentionBackend):
        self.mode = check_mode(mode, device)
        self.device = device
        self.backend = backend
        self._graphs: OrderedDict[tuple, object] = OrderedDict()
        self._pool = None
        self.captures = 0  # graphs captured so far (all modes)

    @property
    def launches_ahead(self) -> bool:
        """Whether block k+1 is launched before block k is read back: in the graph modes,
        unless the attention backend plans each block on the host (from lengths that block k
        advances on the device, so block k+1 is planned after block k ended)."""
        return self.mode != "eager" and not self.backend.plans_on_host

    def run_block(self, program, phase: str) -> None:
        """Decide one block: begin `phase` (a name in `program.phases`), rounds, end.
        Asynchronous in the graph modes; the caller reads the block back (one sync)."""
        planned = self.backend.plans_on_host
        with torch.inference_mode():
            if planned:  # the block's lengths: one sync (nothing runs ahead)
                start, kv_len = program.state.lens.tolist()
                self.backend.plan_block(program.spans(start, kv_len, phase))
            try:
                self._run(program, phase)
            finally:
                if planned:
                    self.backend.end_block()

    def _run(self, program, phase: str) -> None:
        flag = program.state.flag
        if self.mode == "eager":
            program.phases[phase]()
            while bool(flag.item()):
                program.round()
            program.end()
        elif self.mode == "host_loop":
            g_begin, g_round, g_end = self._get(program, phase)
            g_begin.replay()
            while bool(flag.item()):
                g_round.replay()
            g_end.replay()
        else:
            self._get(program, phase).launch()

    def _get(self, program, phase: str):
        key = (id(program), phase, self.mode)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key]
        while len(self._graphs) >= MAX_GRAPHS:
            _, old = self._graphs.popitem(last=False)
            self._free(old)
        t0 = time.perf_counter()
        graphs = self._graphs[key] = self._capture(program, phase)
        self.captures += 1
        log.info("captured %s graphs for %s/%s in %.2f s", self.mode, program.key[0], phase,
                 time.perf_counter() - t0)
        return graphs

    def forget(self, program) -> None:
        """Free the graphs of a program that is dropped (they point at its buffers)."""
        for key in [k for k in self._graphs if k[0] == id(program)]:
            self._free(self._graphs.pop(key))

    def release(self) -> None:
        """Free every captured graph and forget the graph pool (`LLM.sleep`); graphs are
        captured again on first use. `captures` keeps counting."""
        while self._graphs:
            self._free(self._graphs.popitem(last=False)[1])
        self._pool = None

    @property
    def graph_count(self) -> int:
        """Captured graph sets held now."""
        return len(self._graphs)

    def _capture(self, program, phase: str):
        from dlrt.runtime.graphs import WhileGraph, capture_parts

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        begin = program.phases[phase]
        saved = [t.clone() for t in program.buffers()]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            warm_up(program, begin, saved)
            if self.mode == "host_loop":
                graphs = capture_parts([begin, program.round, program.end], self._pool)
            else:
                graphs = WhileGraph(begin, program.round, program.end, program.state.flag,
                                    self._pool)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return graphs

    def _free(self, graphs) -> None:
        """Release captured graphs (their memory returns to the graph pool) once the device
        has finished with them."""
        torch.cuda.synchronize(self.device)
        for g in graphs if isinstance(graphs, list) else [graphs]:
            g.reset() if isinstance(g, torch.cuda.CUDAGraph) else g.close()
