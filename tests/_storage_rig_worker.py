"""A rank of tests/test_storage_rig.py: reads a file through its host's sshfs mount and checks it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist


def _link_bytes(link: str) -> int:
    ns, ifname = link.split(":", 1)
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", ifname], capture_output=True, text=True,
                         check=True).stdout
    return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])


def main() -> None:
    name, digest = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mount, export = os.environ["TORCH_SHARD_RIG_MOUNT"], os.environ["TORCH_SHARD_RIG_EXPORT"]
    # The mount is a filesystem of its own (FUSE), not the exported directory.
    assert os.stat(mount).st_dev != os.stat(export).st_dev, (mount, export)
    # One host reads at a time, so the link's counter shows this host's read alone.
    for turn in range(dist.get_world_size()):
        if turn == rank:
            before = _link_bytes(os.environ["TORCH_SHARD_RIG_LINK"])
            with open(os.path.join(mount, name), "rb") as f:
                data = f.read()
            crossed = _link_bytes(os.environ["TORCH_SHARD_RIG_LINK"]) - before
        dist.barrier()
    ok = torch.tensor([int(hashlib.sha256(data).hexdigest() == digest)])
    dist.all_reduce(ok)
    print(f"rig ok: rank {rank} host {os.environ['TORCH_SHARD_RIG_HOST']} mount {mount} read {len(data)} "
          f"link {crossed} all {int(ok.item())}/{dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
