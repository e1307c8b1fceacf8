"""The ATen ops a call does work with: the CPU's proxy for the kernels it launches on a GPU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

# ATen ops that launch no kernel (metadata only, or allocation without initialisation).
NO_WORK = frozenset(
    "aten::" + name
    for name in (
        "view as_strided _unsafe_view slice select narrow detach detach_ alias lift_fresh t transpose "
        "permute expand expand_as squeeze unsqueeze split split_with_sizes unbind chunk view_as reshape "
        "flatten unflatten _reshape_alias empty empty_like empty_strided new_empty new_empty_strided "
        "resize_ result_type is_nonzero contiguous to"
    ).split()
)


def aten_work_ops(fn: Callable[[], object]) -> Counter:
    """The ATen ops that do work in one call of ``fn``, at every level (a C++ op's own calls included),
    counted by name (torch.profiler events, leaving out NO_WORK)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return Counter(e.name for e in prof.events() if e.name.startswith("aten::") and e.name not in NO_WORK)
