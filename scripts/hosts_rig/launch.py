"""torchrun on each host of a run, started together and waited for together: on this host alone
(``--standalone``, gloo over loopback), or on a rig's hosts (a static rendezvous on host 0's address,
gloo bound to each host's own interface)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .guards import _Deferred, _ExitOnSignal
from .netns import ADDRESSES
from .processes import stop_process_tree

MASTER_PORT = 29500
# Variables a launcher may have left in the environment that would change where the ranks connect or
# how torchrun behaves; each run sets what it needs itself.
_SCRUBBED = ("GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@dataclass
class NodeResult:
    """What one host's torchrun did."""

    node_rank: int
    returncode: int | None  # None: it was stopped at the timeout
    output: str  # stdout and stderr together (empty when not captured)


class TorchrunError(RuntimeError):
    """A torchrun exited non-zero or did not finish in time; the message carries the outputs' tails."""

    def __init__(self, message: str, results: list[NodeResult]):
        super().__init__(message)
        self.results = results


def _worker_env(base: dict[str, str] | None, ifname: str) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    for key in _SCRUBBED:
        env.pop(key, None)
    env["GLOO_SOCKET_IFNAME"] = ifname
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _torchrun_argv(nnodes: int, node_rank: int, nproc: int, script_argv: Sequence[str],
                   master_addr: str = ADDRESSES[0]) -> list[str]:
    if nnodes == 1:
        rdzv = ["--standalone"]
    else:
        rdzv = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
                f"--master-port={MASTER_PORT}"]
    return [sys.executable, "-m", "torch.distributed.run", *rdzv, f"--nproc-per-node={nproc}",
            "--max-restarts=0", *script_argv]


def _tail(text: str, lines: int = 120) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _run_nodes(launch, nnodes: int, timeout: float, capture: bool) -> list[NodeResult]:
    """Start every node's torchrun through ``launch(node_rank, stdout)``, wait for all (or the
    timeout), stop what is left, and return their results; raises TorchrunError unless all exited 0."""
    logs = [tempfile.TemporaryFile("w+") if capture else None for _ in range(nnodes)]
    procs: list[subprocess.Popen] = []
    try:
        for node in range(nnodes):
            procs.append(launch(node, logs[node]))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            # One host failing leaves the other waiting for it until gloo's timeout: stop early.
            if any(p.poll() not in (None, 0) for p in procs):
                time.sleep(2.0)  # let the other side print its error
                break
            time.sleep(0.1)
    finally:
        with _Deferred():
            timed_out = [p.poll() is None for p in procs]
            for p in procs:
                stop_process_tree(p)
    results = []
    for node, p in enumerate(procs):
        output = ""
        if logs[node] is not None:
            logs[node].seek(0)
            output = logs[node].read()
            logs[node].close()
        results.append(NodeResult(node, None if timed_out[node] else p.returncode, output))
    bad = [r for r in results if r.returncode != 0]
    if bad:
        parts = []
        for r in results:
            state = "stopped (still running at the timeout, or after the other host failed)" if r.returncode is None else f"exit {r.returncode}"
            parts.append(f"--- host {r.node_rank}: {state} ---\n{_tail(r.output)}")
        raise TorchrunError("torchrun failed:\n" + "\n".join(parts), results)
    return results


def run_one_host(script_argv: Sequence[str], nproc_per_node: int, *, env: dict[str, str] | None = None,
                 timeout: float = 600.0, capture: bool = True) -> NodeResult:
    """``torchrun --standalone`` on this host, gloo over loopback; raises TorchrunError unless it exits 0."""

    def launch(node, log):
        return subprocess.Popen(_torchrun_argv(1, 0, nproc_per_node, script_argv), env=_worker_env(env, "lo"),
                                start_new_session=True, stdout=log, stderr=subprocess.STDOUT if log else None)

    with _ExitOnSignal():
        return _run_nodes(launch, 1, timeout, capture)[0]
