// ChunkShardingSpec's split, with torch.chunk semantics and upstream's exact offsets.
#pragma once

#include "layout/box.h"

namespace torch_shard {
namespace layout {

// ceil(dim_size / num_chunks): the length of every chunk but the trailing ones.
int64_t chunk_split_size(int64_t dim_size, int64_t num_chunks);

// Length of chunk `index` of `dim_size` split into pieces of `split_size`: the last non-empty chunk may
// be shorter, and every chunk after the dim is exhausted is empty. Never overflows.
int64_t chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t index);

// `dim` in [-ndim, ndim) as an index in [0, ndim); ValueError "Invalid sharding dim" otherwise (as
// upstream's ChunkShardingSpec).
int64_t normalize_chunk_dim(int64_t dim, size_t ndim);

// One box per chunk, in chunk order. The offset of chunk i along `dim` is split_size * i, NOT clamped:
// with more chunks than rows, trailing empty chunks sit past the end (e.g. 2 rows over 4 chunks gives
// offsets 0, 1, 2, 3 with sizes 1, 1, 0, 0), exactly as upstream's ChunkShardingSpec reports them.
// `dim` may be negative. ValueError when an offset would overflow int64.
std::vector<Box> chunk_boxes(const Dims& global_size, int64_t dim, int64_t num_chunks);

} // namespace layout
} // namespace torch_shard
