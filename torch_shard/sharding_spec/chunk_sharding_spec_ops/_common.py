"""Shared machinery of the sharded embedding ops: validation, agreement, autograd-aware exchanges.

Every rank calls the op with its own input. The flow is:

1. local checks, then ONE small agreement collective that also tells every rank how large every other
   rank's packed input is (so a bad input raises on every rank instead of hanging the others);
2. one all-to-all in which every rank sends its packed input (ids, offsets, per-sample weights) to
   every rank;
3. each rank computes, for every requester, what its weight shard contributes;
4. one all-to-all returns the contributions to their requesters (autograd-aware: its backward is the
   reverse all-to-all, so gradients reach the weight shard that produced each contribution).

The exchanges are the C++ ops ``torch.ops.torch_shard._all_to_all`` over the weight's process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch
import torch.distributed as dist

from ..._agreement import agree
from ...sharded_tensor._movement import comm_device
from ..chunk_sharding_spec import ChunkShardingSpec

_ops = torch.ops.torch_shard


class _AllToAll(torch.autograd.Function):
    """All-to-all of a flat buffer whose backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, flat, send_counts, recv_counts, group_name):
        ctx.counts = (send_counts, recv_counts, group_name)
        return _ops._all_to_all(flat, send_counts, recv_counts, group_name)

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts, group_name = ctx.counts
        return _ops._all_to_all(grad.contiguous(), recv_counts, send_counts, group_name), None, None, None


def exchange_chunks(chunks: list[torch.Tensor], recv_shapes: list[tuple], group_name: str) -> list[torch.Tensor]:
    """Send ``chunks[p]`` to rank p and receive from each rank p a tensor of ``recv_shapes[p]``."""
    flat = torch.cat([chunk.reshape(-1) for chunk in chunks])
    send_counts = [chunk.numel() for chunk in chunks]
    recv_counts = [prod(shape) for shape in recv_shapes]
    received = _AllToAll.apply(flat, send_counts, recv_counts, group_name)
    return [piece.view(shape) for piece, shape in zip(received.split(recv_counts), recv_shapes)]


@dataclass
class Bags:
    """One rank's lookups as flat ids plus bag offsets (no trailing offset)."""

    ids: torch.Tensor  # int64 [n]
    offsets: torch.Tensor  # int64 [num_bags]
    per_sample_weights: torch.Tensor | None  # [n] or None

    @property
    def num_bags(self) -> int:
        return self.offsets.numel()

    def bag_of_id(self) -> torch.Tensor:
        n = self.ids.numel()
        ends = torch.cat([self.offsets[1:], torch.tensor([n], dtype=torch.int64, device=self.offsets.device)])
        return torch.repeat_interleave(torch.arange(self.num_bags, device=self.ids.device), ends - self.offsets)


def local_weight(weight, op_name: str):
    """(the single local shard tensor, its offset along the sharded dim, the sharded dim)."""
    shards = weight.local_shards()
    if len(shards) != 1:
        raise ValueError("Only one local shard supported!")
    spec = weight.sharding_spec()
    if not isinstance(spec, ChunkShardingSpec):
        raise ValueError("Only ChunkShardingSpec supported for ShardedTensor ops!")
    dim = spec.dim % weight.dim() if weight.dim() else spec.dim
    if dim not in (0, 1):
        raise RuntimeError(f"nn.Embedding weight sharded on dim {dim} not supported!")
    return shards[0].tensor, shards[0].metadata.shard_offsets[dim], dim


def validate_common(input, weight, max_norm, scale_grad_by_freq, sparse, op_name: str) -> None:
    from ...sharded_tensor import ShardedTensor

    if not isinstance(input, torch.Tensor):
        raise TypeError("input need to be torch.Tensor")
    if not isinstance(weight, ShardedTensor):
        raise TypeError("weight needs to be ShardedTensor")
    if len(weight.size()) != 2:
        raise ValueError("Weight needs to have exactly 2 dims")
    if input.numel() and (int(torch.min(input).item()) < 0 or int(torch.max(input).item()) >= weight.size(0)):
        raise ValueError(
            f"Index out of range in Input {int(torch.min(input).item())} {int(torch.max(input).item())} "
            f"{weight.size(1)}"
        )
    if scale_grad_by_freq:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "scale_grad_by_freq" not supported!')
    if sparse:
        raise RuntimeError(f'nn.{op_name} weight sharded with flag on "sparse" not supported!')
    if max_norm is not None and max_norm <= 0:
        raise ValueError('"max_norm" must be larger than zero!')


def share_bags(bags: Bags, weight, error: BaseException | None, op_name: str) -> list[Bags]:
    """Agree (raising on every rank if any rank's input was rejected), then give every rank every
    rank's bags. One small all-gather plus one all-to-all."""
    pg = weight._process_group
    world = dist.get_world_size(pg)
    device = comm_device(pg, *(s.tensor for s in weight.local_shards()))
    has_psw = bags.per_sample_weights is not None if error is None else False
    n = bags.ids.numel() if error is None else 0
    nb = bags.num_bags if error is None else 0
    rows = agree(pg, device, op_name, error, [n, nb, int(has_psw)])
    if len({row[2] for row in rows}) != 1:
        raise ValueError(f"{op_name}: per_sample_weights must be given on every rank or on none")
    packed = torch.cat([bags.offsets, bags.ids]).to(device)
    counts = [row[0] + row[1] for row in rows]
    received = _ops._all_to_all(packed.repeat(world), [packed.numel()] * world, counts, pg.group_name)
    psw_received = None
    if has_psw:
        psw = bags.per_sample_weights.detach().reshape(-1).to(device)
        psw_received = _ops._all_to_all(psw.repeat(world), [psw.numel()] * world, [row[0] for row in rows], pg.group_name)
    out, pos, psw_pos = [], 0, 0
    for row in rows:
        n_r, nb_r = row[0], row[1]
        chunk = received[pos : pos + nb_r + n_r]
        psw_r = psw_received[psw_pos : psw_pos + n_r] if psw_received is not None else None
        out.append(Bags(ids=chunk[nb_r:], offsets=chunk[:nb_r], per_sample_weights=psw_r))
        pos += nb_r + n_r
        psw_pos += n_r
    return out


def column_order(weight) -> list[tuple[int, int, int]]:
    """(column offset, column count, owner rank) of every column shard, by column offset."""
    owners = []
    for md in weight.metadata().shards_metadata:
        owners.append((md.shard_offsets[1], md.shard_sizes[1], md.placement.rank()))
    return sorted(owners)


def renorm_rows_(local: torch.Tensor, rows: torch.Tensor, max_norm: float, norm_type: float, weight, dim: int) -> None:
    """In-place max_norm renormalisation of the looked-up ``rows`` of the local shard, using each
    row's FULL norm (summed over column shards for a column-sharded weight)."""
    rows = torch.unique(rows)
    with torch.no_grad():
        if dim == 0:
            torch.embedding_renorm_(local, rows, max_norm, norm_type)
            return
        # Column shards: every rank holds a slice of each row; combine |w|^p over all slices.
        part = local.index_select(0, rows).abs().pow(norm_type).sum(dim=1)
        pg = weight._process_group
        dist.all_reduce(part, group=pg)
        norms = part.pow(1.0 / norm_type)
        scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
        local.index_copy_(0, rows, local.index_select(0, rows) * scale.unsqueeze(1).to(local.dtype))
