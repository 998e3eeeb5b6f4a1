"""Run a command inside a new network namespace whose only interface is loopback (Linux).

A local Ray cluster opens a dozen ports on the node's address. The tests and benchmarks start
Ray only inside such a namespace (``unshare --net``, then ``ip link set lo up``), with HOME and
Ray's temp folder in a folder of their own, so nothing is reachable from outside the process
tree and nothing is left in the user's home. A PID namespace comes with it: when the command
ends, the kernel ends every process it left behind (Ray's daemons included). Not root: a user
namespace is added (``unshare --user --map-root-user``), where the kernel allows that.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import GenaiRuntimeError

# The shell stays the namespace's PID 1 (the command after it keeps it from exec'ing), so the
# command runs as an ordinary process; the shell's exit ends everything left in the namespace.
_UP_THEN_RUN = 'ip link set lo up || exit 1; "$@"; exit $?'


def only_loopback() -> bool:
    """Whether this process's network namespace has the loopback interface and nothing else."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def require_only_loopback() -> None:
    """Raise unless this process runs in a loopback-only namespace (guards Ray start-ups)."""
    if not only_loopback():
        names = ", ".join(name for _, name in socket.if_nameindex())
        raise GenaiRuntimeError(
            f"refusing to start Ray: this network namespace has interfaces {names}; run inside "
            "a loopback-only namespace (genai_runtime.integrations.loopback.isolated)"
        )


def _prefix() -> list[str]:
    # --kill-child: if unshare itself is killed (a timeout), the namespace goes with it.
    unshare = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() != 0:  # an unprivileged user namespace, where the kernel allows one
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "sh", "-c", _UP_THEN_RUN, "sh"]


def namespace_problem() -> str | None:
    """None if a loopback-only namespace can be made here, else why not."""
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    try:
        probe = subprocess.run([*_prefix(), "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare could not run: {exc}"
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()[-1:] or [f"exit status {probe.returncode}"]
        return f"unshare is not permitted here ({why[0]})"
    return None


def isolated(argv: Sequence[str], home: str | Path) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` in a loopback-only namespace with
    HOME at ``home`` and Ray's temp folder under it (keep ``home`` short: Ray's socket paths
    must fit in 107 bytes)."""
    home = Path(home)
    (home / "r").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(HOME=str(home), RAY_TMPDIR=str(home / "r"), RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # never join a cluster from outside the namespace
    return [*_prefix(), *argv], env
