"""``visualize_sharding``: a text picture of a ShardedTensor's layout, in the spirit of DTensor's
``torch.distributed.tensor.debug.visualize_sharding``.

The picture is drawn from the global metadata alone (every shard's offsets, sizes and owner), which
every rank holds, so it needs no communication: any rank may call it, or all of them, in any order.
Only the rank asked to print prints; every rank gets the text back.

How the grid is cut: along each dim, every shard boundary is a cut, so every cell of the grid lies in
exactly one shard (shards never overlap, and a valid layout covers the tensor). A layout whose shards
do not line up (two row bands cut at different columns) therefore shows a shard as several
neighbouring cells with the same owner. Empty shards cover no cell; they are listed under the table,
as are ranks that own several shards.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..sharded_tensor.api import ShardedTensorBase
from ..sharding_spec import ChunkShardingSpec, EnumerableShardingSpec
from ._tensor_metadata import ShardedTensorMetadata

__all__ = ["visualize_sharding"]

# (start, stop) of one grid interval along a dim, stop exclusive.
_Interval = tuple[int, int]
# (offsets, sizes, owner label) of one shard: "rank 3", or the placement for a worker-name placement.
_Box = tuple[Sequence[int], Sequence[int], str]


def visualize_sharding(
    tensor: ShardedTensorBase | ShardedTensorMetadata, header: str = "", *, rank: int | None = 0
) -> str:
    """Print, on one rank, a table of the global tensor showing which rank owns each block.

    Works for 1-D and 2-D tensors; a tensor of 3 or more dims is drawn as one 2-D table (its last two
    dims) per block of its leading dims. Chunked and enumerable layouts, uneven blocks, ranks owning
    several blocks and empty shards are all shown (the last two in notes under the table).

    Nothing is communicated: the picture comes from the metadata every rank holds, so each rank may
    call this independently. Ranges in the table are inclusive, as in DTensor's picture.

    Args:
        tensor: a ShardedTensor (or ShardedTensorBase), or a ShardedTensorMetadata.
        header: a line printed above the picture (omitted when empty).

    Keyword args:
        rank: the global rank that prints (default 0; ``None``: no rank prints). Without an
            initialised process group this process counts as rank 0.

    Returns:
        The picture, on every rank (whether or not this rank printed it).

    Raises:
        TypeError: ``tensor`` is neither a ShardedTensor nor a ShardedTensorMetadata.
        ValueError: ``tensor`` is 0-dimensional (it has no blocks to draw).
    """
    if isinstance(tensor, ShardedTensorBase):
        metadata = tensor.metadata()
        spec = tensor.sharding_spec()
    elif isinstance(tensor, ShardedTensorMetadata):
        metadata, spec = tensor, None
    else:
        raise TypeError(
            f"torch_shard.visualize_sharding: expected a ShardedTensor or ShardedTensorMetadata, "
            f"but got {type(tensor).__name__}"
        )
    size = list(metadata.size)
    if not size:
        raise ValueError("torch_shard.visualize_sharding: expected a tensor of at least 1 dim, but got a 0-dim tensor")
    owners = [_owner_label(md.placement) for md in metadata.shards_metadata]
    counts = Counter(owners)
    # A rank owning several shards gets each shard's index too, so two of its shards that touch
    # are told apart (a grid cell shows one shard, not one rank).
    labels = [owner if counts[owner] == 1 else f"{owner} #{i}" for i, owner in enumerate(owners)]
    boxes = [(md.shard_offsets, md.shard_sizes, label) for md, label in zip(metadata.shards_metadata, labels)]

    lines = [header] if header else []
    lines.append(_title(size, metadata.tensor_properties.dtype, len(boxes), spec))
    lines.extend(_picture(size, boxes))
    lines.extend(_notes(boxes, owners))
    text = "\n".join(lines)

    me = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if rank is not None and me == rank:
        print(text, flush=True)
    return text


def _title(size: list[int], dtype: torch.dtype, shards: int, spec) -> str:
    """One line: the global size, dtype, shard count and, when known, the kind of layout."""
    kind = ""
    if isinstance(spec, ChunkShardingSpec):
        kind = f", ChunkShardingSpec(dim={spec.dim})"
    elif isinstance(spec, EnumerableShardingSpec):
        kind = ", EnumerableShardingSpec"
    plural = "" if shards == 1 else "s"
    return f"ShardedTensor {list(size)} {str(dtype).removeprefix('torch.')}: {shards} shard{plural}{kind}"


def _owner_label(placement) -> str:
    """"rank r" for the owner of a placement; the placement itself when it names a worker, not a rank."""
    rank = placement.rank()
    return f"rank {rank}" if rank is not None else str(placement)


def _intervals(boxes: Sequence[_Box], dim: int, length: int) -> list[_Interval]:
    """The grid's intervals along ``dim``: cut at every boundary of every non-empty shard."""
    cuts = {0, length}
    for offsets, sizes, _ in boxes:
        if all(s > 0 for s in sizes):
            cuts.add(min(offsets[dim], length))
            cuts.add(min(offsets[dim] + sizes[dim], length))
    points = sorted(cuts)
    return list(itertools.pairwise(points))


def _owner(boxes: Sequence[_Box], cell_start: Sequence[int]) -> str:
    """The label of the shard holding the cell that starts at ``cell_start`` ("-" if none does)."""
    for offsets, sizes, owner in boxes:
        if all(o <= c < o + s for o, s, c in zip(offsets, sizes, cell_start)):
            return owner
    return "-"  # not covered: cannot happen for a validated layout, but a picture should not fail


def _label(interval: _Interval, plural: str = "", singular: str = "") -> str:
    """Inclusive range of an interval: "rows 3-5", or "row 9" for a single index."""
    start, stop = interval
    return f"{singular}{start}" if stop - start == 1 else f"{plural}{start}-{stop - 1}"


def _picture(size: list[int], boxes: Sequence[_Box]) -> list[str]:
    """The table(s): one for 1-D and 2-D, one per block of the leading dims for more dims."""
    grids = [_intervals(boxes, d, n) for d, n in enumerate(size)]
    if any(not g for g in grids):
        return ["(no elements)"]
    if len(size) == 1:
        header = [_label(iv) for iv in grids[0]]
        return _table([header, [_owner(boxes, [iv[0]]) for iv in grids[0]]], header_rows=1)
    lead, rows, cols = grids[:-2], grids[-2], grids[-1]
    lines: list[str] = []
    for block in itertools.product(*lead):
        if lead:
            index = ", ".join([_label(iv) for iv in block] + [":", ":"])
            lines.append(f"[{index}]")
        table = [[""] + [_label(c, "cols ", "col ") for c in cols]]
        for r in rows:
            start = [iv[0] for iv in block] + [r[0]]
            table.append([_label(r, "rows ", "row ")] + [_owner(boxes, start + [c[0]]) for c in cols])
        lines.extend(_table(table, header_rows=1))
    return lines


def _table(cells: list[list[str]], header_rows: int) -> list[str]:
    """Draw ``cells`` as an ASCII table with a rule under the header rows."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [rule]
    for i, row in enumerate(cells):
        out.append("|" + "|".join(f" {text:<{w}} " for text, w in zip(row, widths)) + "|")
        if i + 1 == header_rows:
            out.append(rule)
    out.append(rule)
    return out


def _notes(boxes: Sequence[_Box], owners: Sequence[str]) -> list[str]:
    """What the table cannot show: empty shards (they cover no cell) and ranks owning several shards."""
    notes = []
    empty = [(offsets, label) for offsets, sizes, label in boxes if any(s == 0 for s in sizes)]
    if empty:
        where = ", ".join(f"{label} at {list(offsets)}" for offsets, label in empty)
        notes.append(f"empty shards: {where}")
    several: dict[str, list[int]] = {}
    for i, owner in enumerate(owners):
        several.setdefault(owner, []).append(i)
    for owner, indices in several.items():
        if len(indices) > 1:
            notes.append(f"{owner} owns {len(indices)} shards: {', '.join(f'#{i}' for i in indices)}")
    return notes
