"""How :class:`~torch_shard.checkpoint.ByteRangeFileSystemReader` reads a load's bytes (``_reader.py``
picks the way; each way takes its bytes through one :class:`source.ChunkSource` per load).

A load's plan, from call to call:

* ``unchecked.py``: ``verify=False``, straight into the destinations.
* ``staged.py``: a checked load's own items, read and checked before the ranks agree
  (``_load_outcome.agree``), written after.
* ``read_once.py``: the items a read-once schedule serves, checked before the agreement, read again
  and handed over after it. The schedule is made once, by the coordinator: ``schedule.py``; what it
  needs besides: ``prefetch.py`` (read-ahead hints), ``exchange.py`` (a round's units between the
  ranks), ``mounts.py`` (whether read-once is on by default).
* ``chunk.py``: how the boxes of one saved chunk are read and checked, for ``staged.py`` and
  ``read_once.py`` alike, and whole chunks read again after the agreement.
"""
