"""torchrun on one host, or on two "hosts" made on this machine from network namespaces.

Two hosts: two network namespaces joined by a veth pair, each end addressed inside its namespace only
(10.213.0.1/24 and 10.213.0.2/24) with its own loopback up; torchrun runs in each namespace with a
static rendezvous on the first address, and gloo binds the namespace's veth (GLOO_SOCKET_IFNAME).
Traffic between the two hosts then crosses a real network interface (TCP over the veth, MTU 1500 by
default) instead of loopback, as it would between machines; traffic within a host stays on its own
loopback. Both hosts still share this machine's cores and memory, and the link is as fast as the
machine copies bytes between namespaces unless a rate caps it (``rate``/--rate, tc's token bucket).

Every run gets its own namespaces, named after this process's pid and a counter (the veth ends carry
the same names), so runs never collide, and the master port is free in a namespace made for the run.
Teardown stops every process left in the namespaces, then deletes them (which deletes the veth pair),
on every exit path: normal exit, exceptions, Ctrl-C, SIGTERM/SIGHUP. Namespaces left behind by a
process that was SIGKILLed are deleted by the next run (their owner's pid is gone).

Needs root and iproute2; :func:`unavailable_reason` says in one line why not where either is missing.

As a tool (from the repository root)::

    python scripts/torchrun_hosts.py --hosts 2 --nproc-per-node 2 -- bench/bench_data_paths.py --sizes 64
    python scripts/torchrun_hosts.py --hosts 1 --nproc-per-node 8 -- bench/bench_data_paths.py

With --storage DIR, any number of hosts (1 to 18) read DIR over sshfs served from a storage namespace,
the server's link capped at --storage-rate (1gbit by default): a cluster's network filesystem, each
host with its own page cache (:class:`StorageHosts`; the notes of scripts/hosts_rig/storage.py say
how). One command starts and stops it: nothing stays mounted, no server runs and no key stays
authorised after it::

    python scripts/torchrun_hosts.py --hosts 2 --nproc-per-node 2 --storage /tmp/ckpt --storage-rate 1gbit \\
        -- bench/bench_checkpoint.py --state replicated --mib 32
"""

from __future__ import annotations

import argparse
import os
import sys

# The rig's modules sit beside this file (scripts/hosts_rig/). Tests and benchmarks load this file by
# its path, where scripts/ is not on the module path: it is added (last, shadowing nothing).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

from hosts_rig.launch import MASTER_PORT, NodeResult, TorchrunError, run_one_host  # noqa: E402
from hosts_rig.mounts import mounts_under  # noqa: E402
from hosts_rig.netns import ADDRESSES, PREFIX_LEN, _ip, unavailable_reason  # noqa: E402
from hosts_rig.processes import _alive, stop_process_tree  # noqa: E402
from hosts_rig.storage import (  # noqa: E402
    RIG_ROOT,
    SSHFS_OPTIONS,
    STORAGE_ADDRESS,
    STORAGE_BRIDGE,
    STORAGE_SUBNET,
    StorageHosts,
    link_bytes,
)
from hosts_rig.storage_tools import install_storage_tools, storage_unavailable_reason  # noqa: E402
from hosts_rig.two_hosts import TwoHosts  # noqa: E402

# What callers that load this file use: the rigs, the one-host launcher, and the helpers their checks
# call (`_ip` to list namespaces, `_alive` to find processes left behind).
__all__ = ["ADDRESSES", "MASTER_PORT", "PREFIX_LEN", "RIG_ROOT", "SSHFS_OPTIONS", "STORAGE_ADDRESS",
           "STORAGE_BRIDGE", "STORAGE_SUBNET", "NodeResult", "StorageHosts", "TorchrunError", "TwoHosts",
           "_alive", "_ip", "install_storage_tools", "link_bytes", "main", "mounts_under", "run_one_host",
           "stop_process_tree", "storage_unavailable_reason", "unavailable_reason"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="1 or 2; with --storage, 1 to 18")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before both sides are stopped")
    parser.add_argument("--mtu", type=int, default=1500, help="veth MTU (two hosts)")
    parser.add_argument("--rate", help="cap the link between the hosts, in tc's units (e.g. 1gbit)")
    parser.add_argument("--storage", metavar="DIR",
                        help="the hosts read DIR over sshfs from a storage namespace (each at the path in "
                             "$TORCH_SHARD_RIG_MOUNT); installs sshfs and openssh-server where missing")
    parser.add_argument("--storage-rate", default="1gbit",
                        help="cap on what the storage server sends, shared by all hosts (tc's units; 'none': uncapped)")
    parser.add_argument("--sshfs-options", default=",".join(SSHFS_OPTIONS),
                        help="sshfs's mount options (default: %(default)s)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("give the script to run after --")
    if args.storage is None and args.hosts not in (1, 2):
        parser.error("--hosts must be 1 or 2 without --storage")
    try:
        if args.storage is not None:
            reason = install_storage_tools()
            if reason is not None:
                sys.exit(reason)
            storage_rate = None if args.storage_rate.lower() == "none" else args.storage_rate
            options = [o for o in args.sshfs_options.split(",") if o]
            with StorageHosts(args.hosts, args.storage, storage_rate=storage_rate, rate=args.rate, mtu=args.mtu,
                              sshfs_options=options) as hosts:
                hosts.torchrun(script, args.nproc_per_node, timeout=args.timeout, capture=False)
        elif args.hosts == 1:
            run_one_host(script, args.nproc_per_node, timeout=args.timeout, capture=False)
        else:
            reason = unavailable_reason()
            if reason is not None:
                sys.exit(reason)
            with TwoHosts(mtu=args.mtu, rate=args.rate) as hosts:
                hosts.torchrun(script, args.nproc_per_node, timeout=args.timeout, capture=False)
    except TorchrunError as exc:
        codes = ", ".join("stopped" if r.returncode is None else f"exit {r.returncode}" for r in exc.results)
        sys.exit(f"torchrun failed ({codes})")
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
