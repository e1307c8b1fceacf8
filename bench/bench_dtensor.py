"""DTensor placement changes: torch_shard.interop.redistribute vs DTensor.redistribute vs one raw
all_to_all_single of exactly the bytes that change owner.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_dtensor.py`` (gloo on CPU; ``--device cuda``:
NCCL, a rank per GPU). 4 ranks: a 1-D mesh of 4 and a 2 x 2 mesh. ``--round-one no_prediction`` measures
torch_shard with a round-1 mechanism off (bench/_round_one.py).

For every case (mesh, source placements -> target placements) and size (float32 squares, and an uneven
size), it prints the median of --repeats (after a warm-up) of the slowest rank's time for:
* DTensor: ``dt.redistribute(mesh, target)``;
* torch_shard: ``torch_shard.interop.redistribute(dt, mesh, target)``;
* raw a2a: one ``dist.all_to_all_single`` whose split sizes are the elements this rank's plan sends to
  and receives from each other rank (what changes owner; nothing packed or unpacked): the floor for
  any redistribution in one collective;
and the MB torch_shard's exchange sent per rank (its own counters) beside the MB that change owner
(computed from the two layouts), which must be equal. "CPU ms" columns: the median of the largest CPU
time of any rank's calling thread during one call (DTensor's and ours): what a call costs its caller
(Python, planning, packing, socket writes made from the caller), without the waits.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from _round_one import ROUND_ONE_MODES, set_round_one
from _timing import timed_cases_with_cpu
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from torch_shard.interop import redistribute
from torch_shard.interop._layouts import _default_group_for_mesh, _group_ranks, _layout_args

S0, S1, R = Shard(0), Shard(1), Replicate()
CASES_1D = [([S0], [S1]), ([S1], [S0]), ([S0], [R]), ([R], [S1])]
CASES_2D = [([S0, S1], [S1, S0]), ([S0, S0], [S1, S1]), ([R, S0], [S0, R]), ([S0, R], [R, S1])]


def _name(placements) -> str:
    return "".join("R" if p.is_replicate() else f"S{p.dim}" for p in placements)


def _moved_counts(size, mesh, src, dst) -> tuple[list[int], list[int]]:
    """Elements this rank sends to / receives from every rank in a redistribution from ``src`` to
    ``dst`` (torch_shard's plan; its own entries are what stays local)."""
    group = _default_group_for_mesh(mesh)
    src_args = _layout_args(tuple(size), mesh, tuple(src), _group_ranks(group))
    dst_args = _layout_args(tuple(size), mesh, tuple(dst), _group_ranks(group))
    send, recv = torch.ops.torch_shard._transfer_counts(
        list(size), *src_args, *dst_args, dist.get_rank(group), dist.get_world_size(group)
    )
    return list(send), list(recv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--sizes", default="64,256,512,1024,2048,4096", help="square sizes, comma-separated")
    parser.add_argument("--uneven", default="2047x2049", help="extra sizes ROWSxCOLS, comma-separated ('' for none)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--round-one", choices=ROUND_ONE_MODES, help="torch_shard's round-1 exchange mode (default: the product's)"
    )
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.round_one is not None and not set_round_one(args.round_one) and rank == 0:
        print(f"this build has no torch_shard._testing_C: --round-one {args.round_one} not applied")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    meshes = {"1-D": (init_device_mesh(args.device, (world,)), CASES_1D)}
    if world == 4:
        meshes["2x2"] = (init_device_mesh(args.device, (2, 2)), CASES_2D)
    sizes = [(n, n) for n in map(int, args.sizes.split(","))]
    sizes += [tuple(map(int, s.split("x"))) for s in args.uneven.split(",") if s]
    if rank == 0:
        print(
            f"torch {torch.__version__}, {world} {'NCCL' if cuda else 'gloo'} ranks on {args.device}, float32, "
            f"median of {args.repeats}; round 1: {args.round_one or 'auto'}; ratios are torch_shard's time over "
            "the other's"
        )
        print(
            f"{'mesh':5} {'case':11} {'size':>10} {'DTensor ms':>11} {'ours ms':>9} {'raw a2a ms':>11} "
            f"{'ours/DT':>8} {'ours/a2a':>9} {'MB sent':>8} {'MB moved':>9} {'DT CPU ms':>10} {'ours CPU ms':>12}"
        )
    element = torch.tensor([], dtype=torch.float32).element_size()
    for mesh_name, (mesh, cases) in meshes.items():
        for size in sizes:
            full = torch.randn(*size, generator=torch.Generator().manual_seed(0)).to(device)
            for src, dst in cases:
                dt = distribute_tensor(full, mesh, src)
                send, recv = _moved_counts(size, mesh, src, dst)
                send[rank] = recv[rank] = 0  # what stays local is no message
                inp = torch.empty(sum(send), device=device)
                out = torch.empty(sum(recv), device=device)
                times = timed_cases_with_cpu(
                    {
                        "dtensor": (None, lambda dt=dt, dst=dst: dt.redistribute(mesh, dst)),
                        "ours": (None, lambda dt=dt, dst=dst: redistribute(dt, mesh, dst)),
                        "a2a": (None, lambda send=send, recv=recv, inp=inp, out=out: dist.all_to_all_single(
                            out, inp, output_split_sizes=recv, input_split_sizes=send)),
                    },
                    args.repeats,
                )
                # Correct, and what it sent.
                torch.ops.torch_shard._comm_stats(True)
                ours = redistribute(dt, mesh, dst)
                sent = torch.ops.torch_shard._comm_stats(True)[0]
                assert torch.equal(ours.to_local(), dt.redistribute(mesh, dst).to_local()), (src, dst, size)
                worst = torch.tensor([sent, sum(send) * element], dtype=torch.float64, device=device)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)
                if rank == 0:
                    (d, d_cpu), (o, o_cpu), (a, _) = (
                        tuple(v * 1e3 for v in times[name]) for name in ("dtensor", "ours", "a2a")
                    )
                    print(
                        f"{mesh_name:5} {_name(src) + '->' + _name(dst):11} {f'{size[0]}x{size[1]}':>10} "
                        f"{d:11.2f} {o:9.2f} {a:11.2f} {o / d:8.2f} {o / a if a else float('nan'):9.2f} "
                        f"{worst[0].item() / 2**20:8.2f} {worst[1].item() / 2**20:9.2f} {d_cpu:10.2f} {o_cpu:12.2f}",
                        flush=True,
                    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
