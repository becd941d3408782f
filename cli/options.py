"""Options and lookups shared by the CLI's command groups: the cluster directory, the
controller API client (local cluster or `--controllers`), the metadata image."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from cli.cluster_config import DEFAULT_CLUSTER_DIR, ClusterConfig, ClusterError
from cli.local_cluster import LocalCluster
from cli.output import OutputFormat, fail

DirOption = typer.Option(
    DEFAULT_CLUSTER_DIR,
    "--dir",
    envvar="AUTOMQ_CLUSTER_DIR",
    help="cluster directory (also AUTOMQ_CLUSTER_DIR)",
)
ControllerDirOption = typer.Option(
    DEFAULT_CLUSTER_DIR,
    "--dir",
    envvar="AUTOMQ_CLUSTER_DIR",
    help="local cluster directory (also AUTOMQ_CLUSTER_DIR); used when --controllers is absent",
)
ControllersOption = typer.Option(
    None,
    "--controllers",
    help="controller API addresses host:port,... of a cluster that is not local",
)
FormatOption = typer.Option(OutputFormat.table, "--format")


def open_cluster(directory: Path) -> tuple[LocalCluster, ClusterConfig]:
    """The cluster in `directory` and its config, or a clear error."""
    cluster = LocalCluster(directory)
    try:
        return cluster, cluster.load()
    except ClusterError as exc:
        fail(str(exc))


def load_component(
    directory: Path, kind: Literal["broker", "controller"], node: int
) -> tuple[LocalCluster, ClusterConfig, str]:
    """The cluster, its config and the component's name (`broker-N`), or a clear error
    for a missing cluster or an unknown node."""
    cluster, config = open_cluster(directory)
    members = config.brokers if kind == "broker" else config.controllers
    if node not in [m.node_id for m in members]:
        fail(
            f"no {kind} {node} in this cluster ({kind}s: "
            f"{', '.join(str(m.node_id) for m in members)})"
        )
    return cluster, config, f"{kind}-{node}"


def controller_client(dir: Path, controllers: str | None):
    """A controller API client for `--controllers host:port,...` (secret and CA from
    AUTOMQ_CONTROLLER_SECRET(_FILE) / AUTOMQ_CONTROLLER_CA_FILE) or the local cluster in
    `dir`; a clear one-line error for bad addresses, a missing cluster or a bad secret."""
    from controlplane.client import ControllerClient

    secret = ca_file = None
    if controllers:
        addresses = [a.strip() for a in controllers.split(",") if a.strip()]
        bad = [a for a in addresses if ":" not in a or not a.rsplit(":", 1)[1].isdigit()]
        if not addresses or bad:
            fail(f"--controllers must be host:port,... (bad: {', '.join(bad) or 'empty'})")
    else:
        try:
            config = LocalCluster(dir).load()
        except ClusterError as exc:
            fail(f"{exc}; or pass --controllers host:port,...")
        addresses = config.quorum_config().api_addresses()
        secret, ca_file = config.api_secret, config.controller_ca_file
    try:
        return ControllerClient(
            addresses,
            timeout_s=15.0,
            request_timeout_s=10.0,
            api_secret=secret,
            ca_file=ca_file,
        )
    except (OSError, ValueError) as exc:
        fail(f"controller API secret: {exc}")


def metadata_image(client):
    """The controller's metadata image, as the typed model (its JSON has string keys)."""
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.image import MetadataImage

    try:
        return MetadataImage.model_validate(client.image())
    except ControllerUnavailableError as exc:
        fail(f"no controller reachable: {exc}")
    except ControllerError as exc:
        fail(f"reading the metadata image failed: {exc}")
