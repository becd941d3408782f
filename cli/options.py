"""Options and lookups shared by the cluster, broker and controller commands."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from cli.output import fail
from cli.processes import DEFAULT_CLUSTER_DIR, ClusterConfig, ClusterError, LocalCluster

DirOption = typer.Option(
    DEFAULT_CLUSTER_DIR,
    "--dir",
    envvar="AUTOMQ_CLUSTER_DIR",
    help="cluster directory (also AUTOMQ_CLUSTER_DIR)",
)


def load_component(
    directory: Path, kind: Literal["broker", "controller"], node: int
) -> tuple[LocalCluster, ClusterConfig, str]:
    """The cluster, its config and the component's name (`broker-N`), or a clear error
    for a missing cluster or an unknown node."""
    cluster = LocalCluster(directory)
    try:
        config = cluster.load()
    except ClusterError as exc:
        fail(str(exc))
    members = config.brokers if kind == "broker" else config.controllers
    if node not in [m.node_id for m in members]:
        fail(
            f"no {kind} {node} in this cluster ({kind}s: "
            f"{', '.join(str(m.node_id) for m in members)})"
        )
    return cluster, config, f"{kind}-{node}"
