"""How radiance's GPU benchmarks time code: medians of CUDA-graph replays.

Decode-size kernels are launch-bound, so a Python loop of launches would time the host. Instead
one CUDA graph holds a sequence of calls (the benchmark rotates inputs across them, so that data
larger than L2 comes from memory); replaying it many times and taking the median over replays,
divided by the calls in the graph, gives the device time one call costs inside a captured
decode step, launch gaps included.

Warm-up is by time, not only by count: a benchmark usually times a candidate right after
something that kept the GPU idle for a while (a torch.compile), and a few replays of a
microsecond-scale graph do not bring its clocks back up. Measured on the H200 before this was
added: the same launch config of a decode epilogue timed 0.1-0.25 µs (5-10%) slower as the
first thing after a compile than a few graphs later in the same run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def graph_replay_us(calls: Sequence[Callable[[], Any]], *, warmup: int = 5, replays: int = 15,
                    warmup_s: float = 0.05) -> float:
    """Median microseconds per call of one CUDA graph that runs ``calls`` in order, after at
    least ``warmup`` replays and ``warmup_s`` seconds of replaying."""
    import torch

    if not calls:
        raise ValueError("graph_replay_us needs at least one call")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first runs (compiles, allocator warm-up) outside the graph
        for call in calls[:3]:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    deadline = time.perf_counter() + warmup_s
    done = 0
    while done < warmup or time.perf_counter() < deadline:
        graph.replay()
        done += 1
        if done % 8 == 0:  # keep the queue short so the clock check follows the device
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(calls))
    del graph
    return statistics.median(times)
