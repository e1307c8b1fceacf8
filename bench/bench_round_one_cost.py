"""What one round 1 of torch_shard's agreed exchange costs per rank as the group grows, W = 2 .. 1024.

One process, no group: the figures come from ``torch.ops.torch_shard_testing._round_one_cost``, which
plans round 1 with the same functions the exchange uses (its slot within the round-1 budget, hub or
all-to-all; NOTE [ Round 1's cost as the group grows ] in csrc/comm/round_one.cpp) and counts the
messages and bytes that plan sends and receives on the busiest rank (the hub, through the hub). On gloo
an all-to-all round 1 sends used bytes only (NOTE [ Round 1 of used bytes ]): its "slots full" column
is the most it can carry, not what every op sends. A hub group's round 1 is that all-to-all when its
history predicts a dense op too big for the hub's slot (NOTE [ Round 1 follows the group's history ]);
the table shows the plan of the group alone, without history.

    python bench/bench_round_one_cost.py
"""

from __future__ import annotations

import torch

import torch_shard._testing_C  # noqa: F401  (registers torch.ops.torch_shard_testing)

WORLDS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GROUPS = {
    "gloo (CPU, point-to-point)": dict(cpu=True, p2p=True),
    "NCCL, or a Python backend": dict(cpu=False, p2p=False),
}


def _kib(value: int) -> str:
    return f"{value / 1024:.1f}"


def main() -> None:
    cost = torch.ops.torch_shard_testing._round_one_cost
    for name, kind in GROUPS.items():
        print(f"\n{name}: round 1 per rank (the busiest rank: the hub when there is one)\n")
        print("| W | mode | slot B | messages | KiB, headers only | KiB, slots full | KiB per message, slots full |")
        print("|---|---|---|---|---|---|---|")
        for world in WORLDS:
            hub, slot, messages, header_bytes, full_bytes, _other = cost(world, **kind)
            mode = "hub" if hub else ("all-to-all, used bytes" if kind["p2p"] else "all-to-all")
            per_peer = full_bytes / max(messages, 1)
            print(
                f"| {world} | {mode} | {slot} | {messages} | {_kib(header_bytes)} | {_kib(full_bytes)} | "
                f"{_kib(per_peer)} |"
            )


if __name__ == "__main__":
    main()
