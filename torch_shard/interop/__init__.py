"""Conversions between torch_shard's ShardedTensor, DTensor and upstream's ShardedTensor.

Each conversion hands the same local tensors to the other library whenever the layouts allow it, so
nothing is copied and in-place updates through one object are seen through the other:
:func:`to_dtensor` / :func:`from_dtensor` (``_dtensor.py``), :func:`from_upstream` /
:func:`to_upstream` (``_upstream.py``); and :func:`redistribute`, a DTensor to other placements in one
exchange (``_redistribute.py``). The DTensor ones read placements and meshes through ``_layouts.py``.
"""

from ._dtensor import from_dtensor, to_dtensor
from ._redistribute import redistribute
from ._upstream import from_upstream, to_upstream

__all__ = ["from_dtensor", "from_upstream", "redistribute", "to_dtensor", "to_upstream"]
