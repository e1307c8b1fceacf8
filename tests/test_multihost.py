"""Two hosts: scatter, reshard and gather across a network link, with torchrun on each host.

The hosts are network namespaces on this machine joined by a veth pair (scripts/torchrun_hosts.py),
two ranks each, with a static torchrun rendezvous on the first host's address and gloo bound to each
host's veth: every exchange between the hosts crosses that link, as between two machines. The ranks
run tests/_multihost_worker.py. The namespaces are deleted however the test ends (the launcher's
teardown stops every process left in them first).

Skips, saying why, only where network namespaces cannot be made (not root, no iproute2, not
permitted by the container).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_multihost_worker.py"
# Start-up of 4 interpreters with torch on a busy 2-core machine is most of the time; the run stops
# early if one host fails.
TIMEOUT_S = 150.0


def _launcher():
    # A script of the repository, not a package module: loaded from its path.
    spec = importlib.util.spec_from_file_location("torchrun_hosts", REPO / "scripts" / "torchrun_hosts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.mark.distributed
def test_reshard_and_gather_across_two_hosts():
    launcher = _launcher()
    reason = launcher.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with launcher.TwoHosts() as hosts:
        names = hosts.names
        results = hosts.torchrun([str(WORKER)], nproc_per_node=2, timeout=TIMEOUT_S)
    ok = [line for line in results[1].output.splitlines() if line.startswith("multihost ok:")]
    assert len(ok) == 1, f"no result line from rank 2 (host 1):\n{results[1].output}"
    assert "gloo on " + names[1] in ok[0]
    # Gone with the run: nothing of it is left on the machine.
    listed = launcher._ip("netns", "list").stdout
    assert not any(name in listed for name in names), listed
