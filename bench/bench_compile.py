"""torch.compile of a model holding a ShardedTensor parameter vs the same model eager, 4 gloo ranks.

Run: ``torchrun --standalone --nproc-per-node=4 bench/bench_compile.py``.
Model: a row-wise sharded EmbeddingBag ([--rows x --dim] float32, sum) feeding a dense MLP
(Linear, LayerNorm, GELU, Linear, LayerNorm, GELU, Linear to 1) replicated on every rank. One training
step = forward + backward of ``out.square().mean()`` on every rank's own --bags bags of --ids-per-bag
random ids. The compiled model (``torch.compile(model)``, default inductor backend) breaks the graph at
the sharded lookup, which runs eagerly; the MLP before and after it is compiled. Reported: each step's
time (slowest rank, median of --repeats after a warm-up, eager and compiled interleaved), the first
compiled call (compilation), the MLP alone eager vs compiled (what compiling can win), the graph breaks
dynamo counted, and the largest difference between the compiled and eager loss and gradients.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _timing import timed_cases

from torch_shard import shard_parameter
from torch_shard.sharding_spec import ChunkShardingSpec


class Model(nn.Module):
    def __init__(self, rows: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="sum")
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.LayerNorm(hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU(),
            nn.Linear(hidden, 1),
        )  # fmt: skip

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(ids, offsets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--bags", type=int, default=2048)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same model on every rank
    model = Model(args.rows, args.dim, args.hidden)
    shard_parameter(model.bag, "weight", ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)]))
    torch.manual_seed(1 + rank)  # every rank its own bags
    ids = torch.randint(0, args.rows, (args.bags * args.ids_per_bag,))
    offsets = torch.arange(0, ids.numel(), args.ids_per_bag)
    pooled = torch.randn(args.bags, args.dim)

    from torch._dynamo.utils import counters  # imports dynamo only now (it takes seconds)

    compiled = torch.compile(model)
    compiled_mlp = torch.compile(model.mlp)
    params = [model.bag.weight.local_shards()[0].tensor, *model.mlp.parameters()]

    def step(net):
        def run():
            for p in params:
                p.grad = None
            net(ids, offsets).square().mean().backward()

        return run

    def mlp_step(net):
        def run():
            net(pooled).square().mean().backward()

        return run

    def loss_and_grads(net):
        for p in params:
            p.grad = None
        loss = net(ids, offsets).square().mean()
        loss.backward()
        return [loss.detach(), *(p.grad.clone() for p in params)]

    counters.clear()
    dist.barrier()
    start = time.perf_counter()
    compiled_result = loss_and_grads(compiled)
    compile_s = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(compile_s, op=dist.ReduceOp.MAX)
    breaks = sum(counters["graph_break"].values())
    eager_result = loss_and_grads(model)
    diff = max(float((a - b).abs().max()) for a, b in zip(compiled_result, eager_result))
    mlp_step(compiled_mlp)()  # compile the MLP alone before timing it
    times = timed_cases(
        {
            "eager": (None, step(model)),
            "compiled": (None, step(compiled)),
            "mlp eager": (None, mlp_step(model.mlp)),
            "mlp compiled": (None, mlp_step(compiled_mlp)),
        },
        args.repeats,
    )
    if rank == 0:
        print(
            f"torch {torch.__version__}, {world} gloo ranks, table {args.rows}x{args.dim} float32 row-wise, "
            f"MLP hidden {args.hidden}, {args.bags} bags x {args.ids_per_bag} ids per rank, "
            f"median of {args.repeats} training steps (forward + backward)"
        )
        print(f"first compiled call (compilation) {compile_s.item():.1f} s; graph breaks counted {breaks}; "
              f"max |compiled - eager| over loss and gradients {diff:.2e}")
        print(f"{'case':<14} {'eager ms':>9} {'compiled ms':>12} {'compiled/eager':>15}")
        for name, eager_key, compiled_key in (("whole step", "eager", "compiled"), ("MLP alone", "mlp eager", "mlp compiled")):
            e, c = times[eager_key], times[compiled_key]
            print(f"{name:<14} {e * 1e3:>9.2f} {c * 1e3:>12.2f} {c / e:>15.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
