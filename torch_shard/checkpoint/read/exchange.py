"""Moving a read-once round's units from the ranks that read them to the ranks that need them, in one
``torch_shard._redistribute`` exchange over the load's group (NOTE [ Reading every stored byte once
across the ranks ])."""

from __future__ import annotations

import torch

from .schedule import Unit


def as_bytes(value: torch.Tensor | None, nbytes: int) -> torch.Tensor:
    """A unit's value as flat uint8 (zeros where its read failed)."""
    if value is None:
        return torch.zeros(nbytes, dtype=torch.uint8)
    return value.contiguous().reshape(-1).view(torch.uint8)


def exchange_round(units: tuple[Unit, ...], ids: list[int], me: int, values: dict, group, device) -> dict[int, torch.Tensor]:
    """Move the units ``ids`` (each crossing ranks) from their readers to their receivers in one
    exchange; returns the units this rank receives, as tensors of their boxes on the CPU."""
    starts, total = [], 0
    for u in ids:
        starts.append(total)
        total += units[u].nbytes
    src_offsets = torch.tensor(starts, dtype=torch.int64).view(-1, 1)
    src_sizes = torch.tensor([units[u].nbytes for u in ids], dtype=torch.int64).view(-1, 1)
    src_owners = [units[u].reader for u in ids]
    targets = [(u, s, r) for u, s in zip(ids, starts) for r in units[u].receivers if r != units[u].reader]
    dst_offsets = torch.tensor([s for _, s, _ in targets], dtype=torch.int64).view(-1, 1)
    dst_sizes = torch.tensor([units[u].nbytes for u, _, _ in targets], dtype=torch.int64).view(-1, 1)
    dst_owners = [r for _, _, r in targets]
    sources = [as_bytes(values.get(u), units[u].nbytes).to(device) for u in ids if units[u].reader == me]
    like = torch.empty(0, dtype=torch.uint8, device=device)
    moved = torch.ops.torch_shard._redistribute(
        sources, like, [total], src_offsets, src_sizes, src_owners, dst_offsets, dst_sizes, dst_owners,
        group.group_name,
    )
    mine = [u for u, _, r in targets if r == me]
    return {u: out.cpu().view(units[u].dtype).view(units[u].lengths) for u, out in zip(mine, moved)}
