"""The storage rig: hosts that read one directory over sshfs from a storage namespace, with the
server's link capped (scripts/torchrun_hosts.py, StorageHosts).

Runs the rig for real: 2 hosts x 1 rank, each reading a file through its own mount
(tests/_storage_rig_worker.py), and checks that the file's bytes arrive intact, cross the server's link
once per host, and that after the run nothing of it is left: no mount under the rig's directory, no
sshd or sshfs of the run, none of its namespaces, its directory (keys, sshd_config) gone.

Skips, saying why, where the rig cannot run: not root, no network namespaces, no /dev/fuse, or sshfs /
openssh-server missing and not installable from Debian's packages.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_storage_rig_worker.py"
TIMEOUT_S = 120.0


def _launcher():
    spec = importlib.util.spec_from_file_location("torchrun_hosts", REPO / "scripts" / "torchrun_hosts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _live_processes_mentioning(text: str, launcher) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not launcher._alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry}: {cmdline}")
    return found


@pytest.mark.distributed
def test_two_hosts_read_a_file_over_the_capped_storage_link(tmp_path):
    launcher = _launcher()
    reason = launcher.install_storage_tools()
    if reason is not None:
        pytest.skip(reason)
    export = tmp_path / "export"
    export.mkdir()
    data = os.urandom(3 << 20)
    (export / "blob.bin").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()

    with launcher.StorageHosts(2, str(export), storage_rate="1gbit") as hosts:
        run_dir, names, storage_ns = hosts.run_dir, hosts.names, hosts.storage_ns
        assert sorted(launcher.mounts_under(run_dir)) == sorted(hosts.mounts)
        results = hosts.torchrun([str(WORKER), "blob.bin", digest], nproc_per_node=1, timeout=TIMEOUT_S)

    for node, result in enumerate(results):
        ok = [line for line in result.output.splitlines() if line.startswith("rig ok:")]
        assert len(ok) == 1, f"no result line from host {node}:\n{result.output}"
        fields = ok[0].split()
        assert fields[fields.index("all") + 1] == "2/2", ok[0]
        assert f"host {node}" in ok[0] and f"/host{node}" in ok[0], ok[0]
        # Each host has its own page cache: both reads cross the server's link (plus SFTP's framing).
        crossed = int(fields[fields.index("link") + 1])
        assert len(data) <= crossed < len(data) * 1.2, ok[0]

    # Nothing of the run is left.
    assert not os.path.exists(run_dir), os.listdir(run_dir)
    if os.path.exists(launcher.RIG_ROOT):
        assert launcher.mounts_under(run_dir) == []
    listed = launcher._ip("netns", "list").stdout
    assert not any(name in listed for name in (*names, storage_ns)), listed
    assert _live_processes_mentioning(run_dir, launcher) == []  # sshd -f <run_dir>/..., sshfs <run_dir>/hostN
    assert (export / "blob.bin").read_bytes() == data  # the exported files are untouched
