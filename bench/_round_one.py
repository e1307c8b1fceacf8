"""The exchange's round-1 mode, for benchmarks that compare its variants."""

from __future__ import annotations

import torch

import torch_shard  # noqa: F401  (loads the extension, which registers torch.ops.torch_shard)

ROUND_ONE_MODES = ("auto", "all_to_all")


def set_round_one(mode: str) -> bool:
    """Set how round 1 of torch_shard's exchange runs on this rank: ``"auto"`` (the library's choice,
    the hub relay where it applies) or ``"all_to_all"`` (everywhere). Every rank must set the same.

    The switch is a test-only op that may move or go: returns False, changing nothing, where this
    build has no such op, so a benchmark can still run (and report that the mode was not applied).
    """
    if mode not in ROUND_ONE_MODES:
        raise ValueError(f"round-one mode must be one of {ROUND_ONE_MODES}, got {mode!r}")
    try:
        op = torch.ops.torch_shard._set_round_one
    except (AttributeError, RuntimeError):
        return False
    op(mode)
    return True
