"""Steady-state data ops on CUDA read no device memory on the host (NOTE [ Headers on the host ]).

    torchrun --standalone --nproc-per-node=<GPUs> scripts/sync_free_check.py

One rank per GPU on a group with NCCL for CUDA tensors and gloo for CPU tensors ("cpu:gloo,cuda:nccl").
Each op (scatter, gather, reshard each way, interop.redistribute each way) runs twice as a loop would,
so the group's history knows it, then once more under ``torch.cuda.set_sync_debug_mode("error")``,
where any host sync raises; its result is checked after. The exchange's own counter of header tables
read from device buffers must stay 0 too. With one GPU there is one rank, which moves nothing (the
single-rank path); the exchange needs 2 GPUs or more. Prints one line per op and
"sync-free: N/N ops" at the end; exits 1 if any op synced or was wrong.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import torch_shard
from torch_shard.interop import redistribute
from torch_shard.sharding_spec import ChunkShardingSpec


def main() -> int:
    dist.init_process_group("cpu:gloo,cuda:nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    mesh = init_device_mesh("cuda", (world,))
    placements = [f"rank:{r}/cuda:{r % torch.cuda.device_count()}" for r in range(world)]
    rows, cols = (ChunkShardingSpec(dim=d, placements=placements) for d in (0, 1))
    n = 512 * world
    full = torch.randn(n, n, device=device, generator=torch.Generator(device).manual_seed(0))
    part = slice(rank * n // world, (rank + 1) * n // world)
    st = torch_shard._shard_tensor(full, rows)
    out = torch.empty(n, n, device=device) if rank == 0 else None
    dt_rows, dt_cols = (distribute_tensor(full, mesh, [Shard(d)]) for d in (0, 1))
    ops = [
        ("scatter", lambda: torch_shard._shard_tensor(full, rows), lambda r: r.local_tensor(), full[part]),
        ("gather", lambda: st.gather(0, out), lambda r: out if rank == 0 else None, full if rank == 0 else None),
        ("reshard to columns", lambda: st.reshard(cols), lambda r: r.local_tensor(), full[:, part]),
        ("reshard to rows", lambda: st.reshard(rows), lambda r: r.local_tensor(), full[part]),
        ("redistribute S0->S1", lambda: redistribute(dt_rows, mesh, [Shard(1)]), lambda r: r.to_local(), full[:, part]),
        ("redistribute S1->S0", lambda: redistribute(dt_cols, mesh, [Shard(0)]), lambda r: r.to_local(), full[part]),
    ]
    for _ in range(2):
        for _, call, _, _ in ops:
            call()
    torch.cuda.synchronize()
    passed = 0
    for name, call, result_of, expected in ops:
        torch.ops.torch_shard._comm_stats(True)
        error = None
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = call()
        except RuntimeError as exc:  # a synchronizing call raises here
            error = f"synced: {str(exc).splitlines()[0]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if error is None:
            reads = torch.ops.torch_shard._comm_stats(False)[6]
            got = result_of(result)
            if reads:
                error = f"{reads} header table(s) read from device buffers"
            elif got is not None and not torch.equal(got, expected):
                error = "wrong result"
        flags = torch.tensor([0 if error is None else 1], device=device)
        dist.all_reduce(flags)
        if rank == 0 or error is not None:
            print(f"rank {rank}: {name}: {'ok' if error is None else error}", flush=True)
        passed += int(flags.item() == 0)
    if rank == 0:
        print(f"sync-free: {passed}/{len(ops)} ops ({world} rank(s))", flush=True)
    dist.destroy_process_group()
    return 0 if passed == len(ops) else 1


if __name__ == "__main__":
    sys.exit(main())
