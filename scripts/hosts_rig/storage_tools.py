"""What the storage rig needs on this machine (root, network namespaces, FUSE, sshfs, sshd and their
helpers), and installing the missing packages from Debian's archive without starting any service."""

from __future__ import annotations

import os
import shutil
import subprocess

from .netns import unavailable_reason

_SSHD = "/usr/sbin/sshd"
_STORAGE_TOOLS = {"sshfs": "sshfs", "fusermount3": "fuse3", "nsenter": "util-linux",
                  "ssh-keygen": "openssh-client", "ssh": "openssh-client", "tc": "iproute2"}


def storage_unavailable_reason() -> str | None:
    """Why the storage rig cannot run here (one line), or None when it can."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    missing = sorted({pkg for tool, pkg in _STORAGE_TOOLS.items() if shutil.which(tool) is None}
                     | (set() if os.access(_SSHD, os.X_OK) else {"openssh-server"}))
    if missing:
        return f"the storage rig needs Debian's {', '.join(missing)} (install_storage_tools() installs them)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE (sshfs) mounts are not possible here"
    return None


def install_storage_tools() -> str | None:
    """Install sshfs and openssh-server from Debian's packages where they are missing (apt-get, as
    root), without starting the system's sshd. Returns why the rig still cannot run, or None."""
    reason = storage_unavailable_reason()
    if reason is None or "install_storage_tools" not in reason:
        return reason
    if shutil.which("apt-get") is None:
        return reason + "; no apt-get to install them"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = "/usr/sbin/policy-rc.d"
    made_policy = not os.path.exists(policy)
    try:
        if made_policy:
            # Tells the packages' scripts not to start services: installing must not leave a server running.
            with open(policy, "w") as f:
                f.write("#!/bin/sh\nexit 101\n")
            os.chmod(policy, 0o755)
        argv = ["apt-get", "install", "-y", "--no-install-recommends", "sshfs", "openssh-server"]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, timeout=600)
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [str(done.returncode)]
            return f"{reason}; apt-get install sshfs openssh-server failed: {tail[0]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{reason}; installing them failed: {exc}"
    finally:
        if made_policy:
            try:
                os.unlink(policy)
            except OSError:
                pass
    return storage_unavailable_reason()
