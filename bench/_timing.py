"""Timing shared by the multi-rank benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def timed(fn, repeats: int) -> float:
    """Median over ``repeats`` iterations (after one warm-up) of the slowest rank's time, in seconds."""
    return timed_cases({"case": (None, fn)}, repeats)["case"]


def timed_cases(cases: dict[str, tuple[Callable | None, Callable]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Several cases interleaved (A, B, C, A, B, C, ...), so machine noise hits them alike.

    Each case is ``(setup, fn)``: ``setup`` (may be None) runs untimed before every ``fn``. Returns, per
    case, the median over ``repeats`` of the slowest rank's time for ``fn``, in seconds.
    """
    return {name: wall for name, (wall, _) in timed_cases_with_cpu(cases, repeats, warmup).items()}


def timed_cases_with_cpu(
    cases: dict[str, tuple[Callable | None, Callable]], repeats: int, warmup: int = 1
) -> dict[str, tuple[float, float]]:
    """As :func:`timed_cases`, with the CPU time of the calling thread beside the wall time: per case,
    (median of the slowest rank's wall time, median of the largest CPU time of any rank's calling
    thread), in seconds. The CPU time is what a call costs its caller (Python, planning, packing, the
    socket writes gloo makes from the caller), without the waits."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    # The slowest rank's time travels on the group's own device: an NCCL group has no CPU backend.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    for i in range(warmup + repeats):
        for name, (setup, fn) in cases.items():
            if setup is not None:
                setup()
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.thread_time()
            fn()
            cpu = time.thread_time() - start_cpu
            elapsed = torch.tensor([time.perf_counter() - start, cpu], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i >= warmup:
                samples[name].append((elapsed[0].item(), elapsed[1].item()))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in samples.items()
    }
