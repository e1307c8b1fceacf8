"""What a checked load trusts before it reads any data: the checkpoint's ``.metadata`` and ``.checksums``.

NOTE [ Checking a checkpoint's metadata ]
DCP's ``.metadata`` is a pickle of what every saved item is (a tensor's size, dtype and chunks; a
bytes item) and where it is stored (file, offset, length). Single bit flips of it often still
unpickle, into other metadata: a chunk's offsets or sizes moved (part of a tensor never read, its
old values kept), an index DCP then cannot find, an attribute of the wrong type. Two checks stand
between it and the data:

* its structure (:func:`check_structure`), for every checked load, with or without ``.checksums``:
  every field of the type DCP gives it, every tensor's chunks inside the tensor and tiling it
  exactly (a chunk moved or resized leaves a gap or an overlap), every chunk and bytes item stored
  somewhere, every stored item at a relative path inside the checkpoint;
* its digest (:func:`digest`), when ``.checksums`` exists: ``ChecksumFileSystemWriter`` records a
  SHA-256 of the metadata's content as it handed it to ``FileSystemWriter.finish``, and the reader
  compares it with the digest of what it unpickled. The digest is of the content, not of the pickle's
  bytes (a pickle of equal metadata may differ between torch releases), and leaves out what a load
  does not use: the checkpoint's path when saved (the directory may have moved) and the load id.

:func:`open_checked` does both, and the ``.checksums`` checks of NOTE [ What .checksums binds to one
save ], for the reader and for ``verify``: one list of what is wrong, so both check the same things.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from .. import _native
from . import _checksums
from ._errors import Corruption

__all__ = ["Checked", "check_structure", "digest", "open_checked"]

METADATA_FILE = ".metadata"


def _canonical(value: Any) -> Any:
    """A JSON-able form of metadata content that is equal exactly when the content is."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Size):
        return ["Size", list(value)]
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format, torch.device)):
        return str(value)
    if isinstance(value, enum.Enum):
        return [type(value).__name__, value.name]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Fields that take no part in equality (MetadataIndex.index, a lookup hint) are left out.
        fields = {f.name: _canonical(getattr(value, f.name, None)) for f in dataclasses.fields(value) if f.compare}
        return [type(value).__name__, fields]
    if isinstance(value, dict):
        pairs = [[_canonical(k), _canonical(v)] for k, v in value.items()]
        return ["dict", sorted(pairs, key=lambda kv: json.dumps(kv[0], sort_keys=True))]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_canonical(v) for v in value]]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes", bytes(value).hex()]
    # Anything else a planner stores: its pickle (deterministic for plain objects; never its repr,
    # which may hold an address).
    return ["pickle", type(value).__qualname__, pickle.dumps(value, protocol=4).hex()]


def digest(metadata: Metadata) -> str:
    """SHA-256 of the metadata content a load uses (NOTE [ Checking a checkpoint's metadata ])."""
    save_id = getattr(getattr(metadata, "storage_meta", None), "save_id", None)
    return digest_of(metadata.state_dict_metadata, metadata.storage_data, metadata.planner_data, save_id)


def digest_of(state_dict_metadata, storage_data, planner_data, save_id: str | None) -> str:
    """:func:`digest` of metadata with these fields (what a writer's ``finish`` is about to write)."""
    content = {
        "state_dict_metadata": _canonical(state_dict_metadata),
        "storage_data": _canonical(storage_data),
        "planner_data": _canonical(planner_data),
        "save_id": save_id,
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_tuple(value, ndim: int | None = None) -> bool:
    return (
        isinstance(value, (torch.Size, tuple, list))
        and all(_is_int(v) and v >= 0 for v in value)
        and (ndim is None or len(value) == ndim)
    )


def check_structure(metadata: Any, file: str = METADATA_FILE) -> list[Corruption]:
    """What is wrong with the structure of ``metadata`` (empty when nothing is): see NOTE [ Checking a
    checkpoint's metadata ]."""
    try:
        return _structure_problems(metadata, file)
    except Exception as e:  # noqa: BLE001 - metadata odd enough to break a check is damaged too
        return [Corruption(None, None, file, None, None, None, f"is malformed ({type(e).__name__}: {e})")]


def _structure_problems(metadata: Any, file: str) -> list[Corruption]:
    bad: list[Corruption] = []

    def wrong(what: str) -> None:
        bad.append(Corruption(None, None, file, None, None, None, what))

    if not isinstance(metadata, Metadata):
        wrong(f"holds a {type(metadata).__name__}, not DCP's Metadata")
        return bad
    items, storage = getattr(metadata, "state_dict_metadata", None), getattr(metadata, "storage_data", None)
    if not isinstance(items, dict) or not isinstance(storage, dict):
        wrong("has no state_dict_metadata or storage_data dict")
        return bad
    needed: list[MetadataIndex] = []
    for fqn, item in items.items():
        if not isinstance(fqn, str):
            wrong(f"has a key {fqn!r} that is not a string")
        elif isinstance(item, BytesStorageMetadata):
            needed.append(MetadataIndex(fqn))
        elif isinstance(item, TensorStorageMetadata):
            bad.extend(_check_tensor(fqn, item, file, _native))
            needed.extend(MetadataIndex(fqn, c.offsets) for c in item.chunks if isinstance(c, ChunkStorageMetadata))
        else:
            wrong(f"'{fqn}' is a {type(item).__name__}, not tensor or bytes metadata")
    if bad:
        return bad
    for index in needed:
        info = storage.get(index)
        if info is None:
            where = f" chunk at {list(index.offset)}" if index.offset is not None else ""
            wrong(f"'{index.fqn}'{where} is stored nowhere (no storage_data entry)")
            continue
        path, offset, length = (getattr(info, name, None) for name in ("relative_path", "offset", "length"))
        if not isinstance(path, str) or not _is_int(offset) or not _is_int(length) or offset < 0 or length < 0:
            wrong(f"'{index.fqn}' has a malformed storage entry ({info!r})")
        elif os.path.isabs(path) or ".." in path.replace("\\", "/").split("/") or not path:
            wrong(f"'{index.fqn}' is stored at {path!r}, outside the checkpoint directory")
    return bad


def _check_tensor(fqn: str, item: TensorStorageMetadata, file: str, native) -> list[Corruption]:
    def wrong(what: str) -> list[Corruption]:
        return [Corruption(fqn, None, file, None, None, None, what)]

    size = item.size
    dtype = getattr(item.properties, "dtype", None)
    if not _int_tuple(size):
        return wrong(f"has a malformed size ({size!r})")
    if not isinstance(dtype, torch.dtype):
        return wrong(f"has a malformed dtype ({dtype!r})")
    chunks = item.chunks
    if not isinstance(chunks, list) or not chunks:
        return wrong("has no chunks")
    for chunk in chunks:
        if (
            not isinstance(chunk, ChunkStorageMetadata)
            or not _int_tuple(chunk.offsets, len(size))
            or not _int_tuple(chunk.sizes, len(size))
        ):
            return wrong(f"has a malformed chunk ({chunk!r})")
    offsets = torch.tensor([list(c.offsets) for c in chunks], dtype=torch.int64).view(len(chunks), len(size))
    sizes = torch.tensor([list(c.sizes) for c in chunks], dtype=torch.int64).view(len(chunks), len(size))
    try:
        native.validate_boxes(offsets, sizes, list(size))
    except (ValueError, RuntimeError) as e:
        return wrong(f"has chunks that do not tile its size {list(size)} exactly ({e})")
    return []


@dataclass
class Checked:
    """A checkpoint's metadata and ``.checksums``, and what is wrong with them.

    Attributes:
        metadata: the unpickled ``.metadata`` (None when it cannot be read).
        checksums: the parsed ``.checksums`` of this save (None when there is none or it cannot be used).
        problems: every failed check of the two files.
        checksums_file: the ``.checksums`` file's name, relative to the checkpoint.
    """

    metadata: Metadata | None
    checksums: _checksums.ChecksumsFile | None
    problems: list[Corruption] = field(default_factory=list)
    checksums_file: str = _checksums.checksums_file_name()


def metadata_file_name(rank: int | None = None) -> str:
    """``.metadata``, or ``__<rank>.metadata`` for rank-local metadata."""
    return METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"


def unpickled(read: Callable[[], Metadata], rank: int | None = None) -> tuple[Metadata | None, list[Corruption]]:
    """``read()`` (a ``FileSystemReader``'s ``read_metadata``); a ``.metadata`` that cannot be
    unpickled is a corruption, not an error.

    Raises:
        FileNotFoundError: when there is no such file (not a checkpoint; DCP's own message).
    """
    try:
        return read(), []
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a damaged file
        what = f"cannot be unpickled ({type(e).__name__}: {e})"
        return None, [Corruption(None, None, metadata_file_name(rank), None, None, None, what)]


def open_checked(fs, path, metadata: Metadata | None, rank: int | None = None, *, use_checksums: bool = True,
                 problems: list[Corruption] | None = None) -> Checked:
    """Check ``metadata`` (read from the checkpoint at ``path``) and its ``.checksums``.

    Args:
        fs, path: the checkpoint, as a ``FileSystemReader`` holds it.
        metadata: its unpickled metadata (None when it could not be read: ``problems`` says why).
        rank: for rank-local metadata (``__<rank>.metadata`` / ``__<rank>.checksums``).
        use_checksums: False leaves ``.checksums`` unread (a load checks zip CRC-32s only).
        problems: failures found while reading the metadata.
    """
    metadata_file = metadata_file_name(rank)
    name = _checksums.checksums_file_name(rank)
    checked = Checked(metadata, None, list(problems or ()), name)
    if metadata is not None:
        checked.problems.extend(check_structure(metadata, metadata_file))
    file = fs.concat_path(path, name)
    if not use_checksums or not fs.exists(file):
        return checked

    def wrong(what: str, file_name: str = name) -> Checked:
        checked.problems.append(Corruption(None, None, file_name, None, None, None, what))
        checked.checksums = None
        return checked

    with fs.create_stream(file, "rb") as stream:
        data = stream.read()
    try:
        sums = _checksums.parse(data)
    except ValueError as e:
        return wrong(f"{e}; the data can still be checked against their zip CRC-32s alone: load with "
                     f"ByteRangeFileSystemReader(path, checksums=False), or verify with "
                     f"`python -m torch_shard.checkpoint verify --no-checksums DIR`")
    checked.checksums = sums
    if metadata is None or checked.problems:
        return checked
    save_id = getattr(getattr(metadata, "storage_meta", None), "save_id", None)
    if sums.save_id != save_id:
        return wrong(
            f"belongs to another save (id {sums.save_id}) than {metadata_file} (id {save_id}): the directory "
            f"holds parts of two saves (a save that stopped between the two files, or a later save by a "
            f"writer that records no checksums; in that case delete {name})"
        )
    if sums.metadata_digest is not None and sums.metadata_digest != digest(metadata):
        return wrong(f"does not hold what its save wrote: its digest differs from the one in {name}",
                     metadata_file)
    missing = [
        index for index, info in metadata.storage_data.items()
        if _checksums.location_key(info.relative_path, info.offset) not in sums.items
    ]
    if missing:
        names = ", ".join(sorted({i.fqn for i in missing})[:5])
        return wrong(f"has no entry for {len(missing)} stored item(s) ({names}...)")
    return checked
