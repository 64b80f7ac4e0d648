"""Runs a block program in one of three execution modes (one decoding contract):

- `eager`: begin, then rounds from Python until the device flag says stop (one host sync per
  round), then end. The only mode on the CPU.
- `host_loop`: begin, round and end each captured as a CUDA graph; the host replays the round
  graph and reads the flag after each (the classic design: one sync per round).
- `device_loop`: one CUDA graph per block, begin -> WHILE(flag) { round } -> end, launched once;
  the GPU repeats the rounds (`dlrt.runtime.graphs.WhileGraph`).

The three run the same tensor code on the same static buffers, so they commit the same tokens.
Graphs are captured on first use per (program, begin variant) and kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from dlrt.errors import OptionError

log = logging.getLogger(__name__)

MODES = ("device_loop", "host_loop", "eager")


def check_mode(mode: str, device: torch.device) -> str:
    """Return `mode` if it can run on `device`; OptionError otherwise."""
    if mode not in MODES:
        raise OptionError(f"execution_mode {mode!r} is not one of {MODES}")
    if mode != "eager" and device.type != "cuda":
        raise OptionError(f"execution_mode {mode!r} needs a CUDA device; use 'eager' on "
                          f"{device.type}")
    return mode


class Executor:
    def __init__(self, mode: str, device: torch.device):
        self.mode = check_mode(mode, device)
        self.device = device
        self._graphs: dict[tuple, object] = {}
        self._pool = None

    def launches_ahead(self, runner) -> bool:
        """Whether block k+1 is launched before block k is read back: in the graph modes,
        unless the runner's attention backend plans each block on the host (from lengths that
        block k advances on the device, so block k+1 is planned after block k ended)."""
        return self.mode != "eager" and not runner.plans_on_host

    def run_block(self, program, begin: Callable[[], None] | None = None) -> None:
        """Decide one block: begin (default `program.begin`), rounds, end. Asynchronous in
        the graph modes; the caller reads the block back (one sync)."""
        begin = begin or program.begin
        flag = program.state.flag
        runner = program.runner
        with torch.inference_mode():
            if runner.plans_on_host:  # the block's lengths: one sync (nothing runs ahead)
                start, kv_len = program.state.lens.tolist()
                runner.plan_attention(program.spans(start, kv_len, begin))
            try:
                self._run(program, begin, flag)
            finally:
                if runner.plans_on_host:
                    runner.backend.disarm()

    def _run(self, program, begin, flag) -> None:
        if self.mode == "eager":
            begin()
            while bool(flag.item()):
                program.round()
            program.end()
        elif self.mode == "host_loop":
            g_begin, g_round, g_end = self._get(program, begin)
            g_begin.replay()
            while bool(flag.item()):
                g_round.replay()
            g_end.replay()
        else:
            self._get(program, begin).launch()

    def _get(self, program, begin):
        key = (id(program), begin.__name__, self.mode)
        if key not in self._graphs:
            t0 = time.perf_counter()
            self._graphs[key] = self._capture(program, begin)
            dt = time.perf_counter() - t0
            log.info("captured %s graphs for %s/%s in %.2f s", self.mode, program.key[0],
                     begin.__name__, dt)
        return self._graphs[key]

    def _capture(self, program, begin):
        from dlrt.runtime.graphs import WhileGraph, capture_parts

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        saved = [t.clone() for t in program.buffers()]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            begin()  # warm-up outside capture: Triton compiles, cuBLAS picks kernels
            program.round()
            program.end()
            for t, s in zip(program.buffers(), saved, strict=True):
                t.copy_(s)
            if self.mode == "host_loop":
                graphs = capture_parts([begin, program.round, program.end], self._pool)
            else:
                graphs = WhileGraph(begin, program.round, program.end, program.state.flag,
                                    self._pool)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return graphs
