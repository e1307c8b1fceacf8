"""The saved chunks of a checkpoint as one load reads them: :class:`ChunkSource`, the one interface
every way of reading (this rank's own reads, read-once, the unchecked reader) takes bytes through.

A strategy is handed a ``ChunkSource`` and asks it for what a chunk is (:meth:`ChunkSource.place`,
:meth:`ChunkSource.expected`), for a chunk's boxes read and checked (:meth:`ChunkSource.read_boxes`),
for a bytes item (:meth:`ChunkSource.read_bytes`), or for a file to read from itself
(:meth:`ChunkSource.handle`, :meth:`ChunkSource.stream`). It owns the load's open files, so a file is
opened once per load however many strategies read from it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem

from .._archive import BytesSource, FileSource, Source
from .._checksums import location_key
from .._errors import Corruption
from .._load_outcome import this_rank
from .._saved_item import Expected, ItemPlace, open_chunk, read_bytes_item
from .._timing import spent
from .chunk import Box, read_chunk_boxes, reads_whole


@dataclass(kw_only=True)
class ChunkSource:
    """The data files of one checkpoint for one load, and what its metadata says each chunk is.

    Attributes:
        fs, path, storage_data: the ``FileSystemReader``'s file system, checkpoint directory and
            storage index (where each saved item lies).
        opened: the load's exit stack; the files :meth:`handle` opens stay open until it closes.
        transforms, slice_file: the ``FileSystemReader``'s stream transforms and its view of one
            item's bytes within a file, for chunks a stream-transforming extension wrote.
        metadata: the checkpoint's checked ``.metadata`` (None for an unchecked load).
        checksums: its parsed ``.checksums`` (None where there is none, or it is not used).
    """

    fs: object
    path: object
    storage_data: dict
    opened: contextlib.ExitStack
    transforms: object = None
    slice_file: Callable | None = None
    metadata: Metadata | None = None
    checksums: object = None
    # The load's unbuffered handles, by file; read_chunk_boxes keeps its one scratch buffer in
    # _scratch, so a load allocates it once.
    _handles: dict[str, object] = field(default_factory=dict, init=False, repr=False)
    _scratch: dict = field(default_factory=dict, init=False, repr=False)

    def stream(self, relative_path: str):
        """A new (buffered) stream on a data file, for the caller to close."""
        return self.fs.create_stream(self.fs.concat_path(self.path, relative_path), "rb")

    def handle(self, relative_path: str):
        """The load's unbuffered handle on a data file, opened on first use and closed with the load
        (positioned reads: a buffered reader would fetch a full buffer around each of the archive
        directory's small reads)."""
        raw = self._handles.get(relative_path)
        if raw is None:
            stream = self.opened.enter_context(self.stream(relative_path))
            raw = self._handles[relative_path] = getattr(stream, "raw", stream)
        return raw

    def place(self, index: MetadataIndex) -> ItemPlace:
        """Where the saved item ``index`` lies, as a corruption names it."""
        offset = tuple(index.offset) if index.offset is not None else None
        return ItemPlace(index.fqn, offset, self.storage_data[index].relative_path, this_rank())

    def expected(self, index: MetadataIndex) -> Expected:
        """What the checkpoint says the saved item ``index`` is: its shape and dtype (tensors) and the
        writer's digests (where ``.checksums`` has them)."""
        info = self.storage_data[index]
        place = self.place(index)
        sums = None
        if self.checksums is not None:
            sums = self.checksums.items.get(location_key(info.relative_path, info.offset))
        md = self.metadata.state_dict_metadata.get(index.fqn)
        if isinstance(md, TensorStorageMetadata):
            chunk = next(c for c in md.chunks if tuple(c.offsets) == place.chunk_offsets)
            return Expected(place, tuple(chunk.sizes), md.properties.dtype, sums)
        return Expected(place, None, None, sums)

    def open(self, index: MetadataIndex, boxes: list[Box], item: ReadItem | None = None) -> tuple[Source, Expected]:
        """The saved item ``index`` as a :class:`Source` (decoded, where a stream-transforming extension
        wrote it; ``item`` is what the transforms are told), and what the checkpoint says it is.
        Raises OSError where it cannot be read."""
        info = self.storage_data[index]
        expected = self.expected(index)
        if info.transform_descriptors:
            with self.stream(info.relative_path) as stream:
                decoded = self.transforms.transform_load_stream(
                    item, info.transform_descriptors, self.slice_file(stream, info)
                ).read(-1)
            return BytesSource(decoded, info.offset), expected
        whole = reads_whole(info.length, expected, boxes)
        return FileSource(self.handle(info.relative_path), info.offset, info.length, windows=whole), expected

    def read_boxes(self, index: MetadataIndex, boxes: list[Box], may_defer: list[bool], corruptions: list[Corruption],
                   *, check_only: bool = False, item: ReadItem | None = None) -> list:
        """Read and check ``boxes`` of the saved chunk ``index`` as :func:`read_chunk_boxes` decides; a
        value per box (None where it failed: what failed goes into ``corruptions``, a file that cannot
        be read included)."""
        try:
            source, expected = self.open(index, boxes, item)
            clock = time.perf_counter()
            archive, bad = open_chunk(source, expected)
            spent("read_s", clock)
            if archive is None:
                corruptions.extend(bad)
                return [None] * len(boxes)
            values, bad = read_chunk_boxes(source, archive, expected, boxes, may_defer,
                                           self.storage_data[index].relative_path, str(self.path), self._scratch,
                                           check_only=check_only)
        except OSError as e:
            corruptions.append(self.unreadable(index, e))
            return [None] * len(boxes)
        corruptions.extend(bad)
        return values

    def read_bytes(self, index: MetadataIndex, boxes: list[Box], item: ReadItem,
                   corruptions: list[Corruption]) -> bytes | None:
        """The saved bytes item ``index``, checked (None where it failed, and why in ``corruptions``)."""
        try:
            source, expected = self.open(index, boxes, item)
            data, bad = read_bytes_item(source, expected)
        except OSError as e:
            corruptions.append(self.unreadable(index, e))
            return None
        corruptions.extend(bad)
        return None if bad else data

    def unreadable(self, index: MetadataIndex, error: OSError) -> Corruption:
        """A missing, truncated or undecodable file: the item ``index`` is damaged."""
        return self.place(index).corruption(None, None, None, None,
                                            f"cannot be read ({type(error).__name__}: {error})")
