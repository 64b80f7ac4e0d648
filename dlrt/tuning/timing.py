"""GPU timing helpers for the load-time tuners and the benchmarks (CUDA events, graphs)."""

from __future__ import annotations

import statistics

import torch


def event_us(fn, reps: int = 5) -> float:
    """Median over `reps` calls of `fn`'s GPU time in microseconds (CUDA events, the device
    idle before each call)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds per call, replayed from a graph of `reps` calls (median of 5)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(reps):
            fn()
    return event_us(g.replay) / reps
