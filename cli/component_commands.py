"""What `automqctl broker` and `automqctl controller` do alike to one component of a local
cluster: stop it gracefully, or kill it."""

from __future__ import annotations

from cli.cluster_config import ClusterError
from cli.local_cluster import STOP_TIMEOUT_S, LocalCluster
from cli.output import OutputFormat, fail, print_result


def stop_component(
    cluster: LocalCluster, name: str, format: OutputFormat, timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """Stop component `name` (SIGTERM, SIGKILL after `timeout_s`) and say so; a clear
    error when it does not run or does not go."""
    try:
        stopped = cluster.stop(name, timeout_s=timeout_s)
    except ClusterError as exc:
        fail(str(exc))
    if not stopped:
        fail(f"{name} is not running")
    print_result({"stopped": name}, format, f"stopped {name}")


def kill_component(cluster: LocalCluster, name: str, format: OutputFormat) -> None:
    """kill -9 component `name` (a crash) and say which PIDs went; a clear error when it
    does not run."""
    try:
        pids = cluster.kill(name)
    except ClusterError as exc:
        fail(str(exc))
    if not pids:
        fail(f"{name} is not running")
    print_result(
        {"killed": name, "pids": pids}, format, f"killed {name} (pid {', '.join(map(str, pids))})"
    )
