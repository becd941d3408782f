"""`automqctl failover --bucket N` and `automqctl failover status`: object-storage failover.

New objects go to the active bucket (AKIP-1). The controller leader switches to the failover
bucket by itself when most brokers' writes to the main bucket fail for
`bucket_failover_detect_ms`; an operator switches either way at any time. Going back to the
main bucket is manual by default. Objects already written stay where they are: each is read
from its own bucket.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import ClusterError
from cli.external_buckets import check_bucket_reachable
from cli.local_cluster import LocalCluster
from cli.options import ControllerDirOption as DirOption
from cli.options import ControllersOption, FormatOption, controller_client
from cli.output import OutputFormat, console, fail, print_data, waiting

app = typer.Typer(
    help="Object-storage failover: which bucket new objects go to "
    "(`failover --bucket 1`, `failover --bucket 0` to go back, `failover status`).",
    invoke_without_command=True,
)


@app.callback()
def switch(
    ctx: typer.Context,
    bucket: int | None = typer.Option(
        None, "--bucket", help="the bucket new objects go to from now on (1: failover, 0: main)"
    ),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Switch writes of new objects to --bucket now (prints the mode and since when)."""
    if ctx.invoked_subcommand is not None:
        if bucket is not None:
            fail("--bucket switches writes; it cannot be combined with a subcommand")
        return
    if bucket is None:
        fail("give --bucket N to switch writes, or `automqctl failover status`")
    if bucket < 0:
        fail(f"--bucket must be a bucket id >= 0, not {bucket}")
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.requests import SetActiveBucketRequest

    # an unreachable target would only move the failure: refuse before anything changes
    # (the cluster's own bucket config is known for a local cluster only)
    if not controllers:
        try:
            config = LocalCluster(dir).load()
        except ClusterError as exc:
            fail(f"{exc}; or pass --controllers host:port,...")
        target = next((b for b in config.buckets if b.bucket_id == bucket), None)
        if target is not None:
            try:
                check_bucket_reachable(target)
            except ClusterError as exc:
                fail(f"cannot switch writes; nothing changed: {exc}")
    client = controller_client(dir, controllers)
    try:
        result = client.set_active_bucket(
            SetActiveBucketRequest(bucket_id=bucket, reason=f"operator: failover --bucket {bucket}")
        )
    except ControllerUnavailableError as exc:
        fail(f"no controller leader reachable; nothing changed: {exc}")
    except ControllerError as exc:
        fail(f"the controller refused: {exc.message}")
    data = result.model_dump()
    if print_data(data, format):
        return
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(result.since_ms / 1000))
    note = "" if result.changed else " (already active)"
    console.print(
        f"mode [bold]{result.mode}[/]: new objects go to bucket {result.active_bucket_id}"
        f"{note}, since {since} UTC"
    )


LEADER_WAIT_S = 15.0


def _leader_status(client) -> dict:
    """The leader's /v1/status (only the leader has the brokers' health reports)."""
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError

    last = "no controller answered"
    deadline = time.monotonic() + LEADER_WAIT_S
    with waiting(f"looking for the controller leader (up to {LEADER_WAIT_S:g}s)"):
        while time.monotonic() < deadline:
            for address in client.addresses:
                try:
                    status = client.status(address)
                except (ControllerUnavailableError, ControllerError) as exc:
                    last = str(exc)
                    continue
                if status.get("raft", {}).get("state") == "leader":
                    return status
                last = f"{address} is not the leader"
            time.sleep(0.3)
    fail(f"no controller leader reachable: {last}")


@app.command()
def status(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Mode, active bucket, since when and why, detection settings, and per bucket: objects,
    bytes and write health as the brokers report it."""
    client = controller_client(dir, controllers)
    data = _leader_status(client).get("bucket_failover")
    if data is None:
        fail("the controller does not report object-storage failover (an older version?)")
    if print_data(data, format):
        return
    since = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["since_ms"] / 1000))
        if data["since_ms"]
        else "cluster start"
    )
    why = (
        f" ({'automatic' if data['auto'] else 'manual'}: {data['reason']})"
        if data["since_ms"]
        else ""
    )
    console.print(
        f"mode [bold]{data['mode']}[/]: new objects go to bucket {data['active_bucket_id']} "
        f"since {since}{why}",
        soft_wrap=True,
    )
    back = f"after {data['auto_return_ms']} ms healthy" if data["auto_return_ms"] else "manual only"
    console.print(
        f"automatic failover after {data['detect_ms']} ms of failed writes to the main bucket "
        f"(to bucket {data['failover_bucket_id']}); going back: {back}"
    )
    table = Table(title="buckets")
    for col in ("id", "active", "healthy", "objects", "bytes", "reports", "last error"):
        table.add_column(col)
    for b in data["buckets"]:
        healthy = {True: "[green]yes[/]", False: "[bold red]no[/]", None: "unknown"}[b["healthy"]]
        table.add_row(
            str(b["bucket_id"]),
            "yes" if b["bucket_id"] == data["active_bucket_id"] else "",
            healthy,
            str(b["objects"]),
            str(b["bytes"]),
            f"{b['failing_reports']} failing of {b['reports']}",
            b["last_error"] or "",
        )
    console.print(table)
