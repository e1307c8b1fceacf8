"""Timing shared by the multi-rank benchmarks."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def timed(fn, repeats: int) -> float:
    """Median over ``repeats`` iterations (after one warm-up) of the slowest rank's time, in seconds."""
    fn()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        samples.append(elapsed.item())
    return statistics.median(samples)
