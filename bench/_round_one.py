"""Variants of torch_shard's exchange round 1, for benchmarks that measure each mechanism against its
absence (the switches are test-only: torch.ops.torch_shard_testing._set_exchange)."""

from __future__ import annotations

# Variant name -> the switches it changes (all others as in the product).
VARIANTS: dict[str, dict[str, bool | int]] = {
    "auto": {},
    "all_to_all": {"hub": False},  # round 1 as one all-to-all everywhere
    "no_ride": {"ride": False},  # no payloads riding the hub's messages
    "hub8": {"hub_max_world": 8},  # the hub only for groups of up to 8 ranks (the default before 16)
    "no_prediction": {"rooms": False},  # round 1 ignores the group's history (the hub there, base rooms)
    "split": {"split": True},  # round 1's headers on the host, as on CUDA groups with a CPU backend
}
ROUND_ONE_MODES = tuple(VARIANTS)


def set_round_one(mode: str) -> bool:
    """Set round 1 of torch_shard's exchange on this rank to variant ``mode`` (see VARIANTS). Every
    rank must set the same. Returns False, changing nothing, where this build has no testing library,
    so a benchmark can still run (and report that the variant was not applied)."""
    if mode not in VARIANTS:
        raise ValueError(f"round-one mode must be one of {ROUND_ONE_MODES}, got {mode!r}")
    import torch  # here: the sweep driver imports this module without torch

    try:
        import torch_shard._testing_C  # noqa: F401  (registers torch.ops.torch_shard_testing)

        op = torch.ops.torch_shard_testing._set_exchange
    except (ImportError, AttributeError, RuntimeError):
        return False
    op(**VARIANTS[mode])
    return True
