"""Throughput of the hashes a checkpoint's checks could use, on this machine, one core.

Run: ``python bench/bench_hash.py``. For each hash: GB/s over one 64 MiB buffer in memory (the cost of
checking a whole record), over the same bytes as 64 KiB tiles hashed one call each (the cost of the
tile checks of a partial read, where the per-call overhead shows), and through the incremental
interface over 1 MiB pieces (how a whole record is hashed while it is read). The input is what the
checks pass: a ``memoryview`` of a CPU tensor's memory (no copy). ``--mib 1`` measures hashing in the
cache (how a load hashes: each piece while it is in the cache). Hashes whose package is not installed
are skipped; ``crc32c`` is not a dependency (``pip install crc32c`` to compare it). The numbers that
chose XXH3-64 are in ``torch_shard/checkpoint/_digest.py`` (NOTE [ Which hash .checksums records ]).
"""

from __future__ import annotations

import argparse
import time
import zlib

import torch


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _candidates() -> dict:
    """name -> (one-shot hash(bytes-like) -> int, incremental hasher factory or None)."""
    from torch_shard.checkpoint._archive import CRC32_BACKEND, crc32

    found = {
        "zlib.crc32": (zlib.crc32, None),
        f"_archive.crc32 ({CRC32_BACKEND})": (crc32, None),
    }
    try:
        import crc32c

        found["crc32c.crc32c"] = (crc32c.crc32c, None)
    except ImportError:
        pass
    try:
        import xxhash

        found["xxhash.xxh3_64_intdigest"] = (xxhash.xxh3_64_intdigest, xxhash.xxh3_64)
        found["xxhash.xxh3_128_intdigest"] = (xxhash.xxh3_128_intdigest, xxhash.xxh3_128)
        found["xxhash.xxh64_intdigest"] = (xxhash.xxh64_intdigest, xxhash.xxh64)
    except ImportError:
        pass
    from torch_shard.checkpoint import _digest

    found[f"_digest.digest ({_digest.ALGORITHM}, what .checksums records)"] = (_digest.digest, _digest.hasher)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--tile-kib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.randint(0, 256, (args.mib << 20,), dtype=torch.uint8)
    view = memoryview(data.numpy())
    n = len(view)
    tile = args.tile_kib << 10
    tiles = [view[i : i + tile] for i in range(0, n, tile)]
    piece = 1 << 20
    print(f"{args.mib} MiB in memory (memoryview of a uint8 tensor), best of {args.repeats}; GB/s")
    print(f"| hash | whole | {args.tile_kib} KiB tiles | incremental, 1 MiB pieces |")
    print("|---|---|---|---|")
    for name, (one, incremental) in _candidates().items():
        one(view)  # accepts a memoryview of tensor memory (raises otherwise)
        whole = _best_of(lambda: one(view), args.repeats)
        per_tile = _best_of(lambda: [one(t) for t in tiles], args.repeats)

        def pieces():
            if incremental is None:  # a CRC continues from the last value
                value = 0
                for at in range(0, n, piece):
                    value = one(view[at : at + piece], value)
                return value
            h = incremental()
            for at in range(0, n, piece):
                h.update(view[at : at + piece])
            return h.intdigest()

        try:
            streamed = f"{n / _best_of(pieces, args.repeats) / 1e9:.1f}"
        except TypeError:
            streamed = "-"
        print(f"| {name} | {n / whole / 1e9:.1f} | {n / per_tile / 1e9:.1f} | {streamed} |")


if __name__ == "__main__":
    main()
