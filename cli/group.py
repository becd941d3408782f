"""`automqctl group list|describe`: consumer groups of both kinds over the Kafka protocol.

Classic groups (JoinGroup/SyncGroup) and KIP-848 consumer groups (ConsumerGroupHeartbeat)
alike, through confluent-kafka's admin client, which describes a consumer group with
ConsumerGroupDescribe (members' current and target assignments) and a classic one with
DescribeGroups; the epochs of a consumer group (group, assignment, members') come from
ConsumerGroupDescribe asked directly (cli/share_group.py), as librdkafka does not hand them
out. The lag of a partition is its end offset minus the group's committed offset.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import ClusterError
from cli.kafka_util import check_reachable, client_error_text, librdkafka_security
from cli.local_cluster import LocalCluster
from cli.output import OutputFormat, console, fail, print_data
from cli.share_group import (
    ShareDescribeError,
    consumer_group_epochs,
    print_share_group,
    share_rows,
)
from cli.topic import BootstrapOption, DirOption, FormatOption

app = typer.Typer(
    help="Consumer groups, classic and KIP-848, and share groups (Kafka protocol).",
    no_args_is_help=True,
)
ADMIN_TIMEOUT_S = 30.0
MAX_GROUPS = 10_000


def _endpoint(bootstrap: str | None, dir: Path) -> tuple[str, dict | None]:
    """(bootstrap servers, the CLI's client security) of --bootstrap-server, else of the
    local cluster in `dir` (with its SASL/TLS login)."""
    try:
        cluster = None if bootstrap else LocalCluster(dir).load()
        servers = bootstrap or cluster.bootstrap_servers()
        security = LocalCluster(dir).client_security() if cluster is not None else None
        check_reachable(servers, timeout_s=5.0)
    except (ClusterError, ConnectionError, ValueError) as exc:
        fail(f"{exc}" + ("" if bootstrap else "; or pass --bootstrap-server"))
    return servers, security


def _admin(bootstrap: str | None, dir: Path):
    """confluent-kafka's AdminClient for --bootstrap-server, else the local cluster in `dir`
    (with its SASL/TLS login)."""
    from confluent_kafka.admin import AdminClient

    servers, security = _endpoint(bootstrap, dir)
    return AdminClient(
        {"bootstrap.servers": servers, "client.id": "automqctl", **librdkafka_security(security)}
    )


def _name(value: object) -> str:
    """An enum of confluent-kafka (ConsumerGroupState.STABLE) as Kafka spells it."""
    name = getattr(value, "name", None) or str(value)
    return name.replace("_", " ").title().replace(" ", "") if name.isupper() else name


def _state(state: object, group_type: str) -> str:
    """librdkafka knows only the classic states; a consumer group's other state (the broker
    computes target assignments at once, so never Assigning for long) is Reconciling."""
    name = _name(state)
    return "Reconciling" if name == "Unknown" and group_type == "consumer" else name


def _partitions(assignment) -> list[dict]:
    parts = assignment.topic_partitions if assignment is not None else []
    return [{"topic": tp.topic, "partition": tp.partition} for tp in parts]


def _lag(admin, group_id: str) -> list[dict]:
    """Committed offset, end offset and lag of every partition the group committed."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import OffsetSpec

    committed = (
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)])[group_id]
        .result(ADMIN_TIMEOUT_S)
        .topic_partitions
    )
    committed = [tp for tp in committed if tp.offset >= 0]
    if not committed:
        return []
    ends = admin.list_offsets(
        {tp: OffsetSpec.latest() for tp in committed}, request_timeout=ADMIN_TIMEOUT_S
    )
    rows = []
    for tp in sorted(committed, key=lambda t: (t.topic, t.partition)):
        end = next(
            (
                f.result(ADMIN_TIMEOUT_S).offset
                for k, f in ends.items()
                if (k.topic, k.partition) == (tp.topic, tp.partition)
            ),
            -1,
        )
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "committed": tp.offset,
                "end": end,
                "lag": max(0, end - tp.offset) if end >= 0 else None,
            }
        )
    return rows


@app.command("list")
def list_(
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """List groups: id, type (classic or consumer) and state."""
    admin = _admin(bootstrap_server, dir)
    try:
        listed = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result(ADMIN_TIMEOUT_S)
    except Exception as exc:  # confluent-kafka: KafkaException, timeouts
        fail(f"listing groups failed: {client_error_text(exc)}")
    rows = sorted(
        (
            {
                "group": g.group_id,
                "type": _name(g.type).lower(),
                "state": _state(g.state, _name(g.type).lower()),
            }
            for g in listed.valid[:MAX_GROUPS]
        ),
        key=lambda r: r["group"],
    )
    # librdkafka lists consumer and classic groups only: add the share groups
    rows = sorted(rows + share_rows(admin, rows, *_endpoint(bootstrap_server, dir)), key=_group)
    if print_data(rows, format):
        return
    table = Table(title="groups")
    for col in ("group", "type", "state"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["group"], r["type"], r["state"])
    console.print(table)


@app.command()
def describe(
    group_id: str,
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """A group's type, state, assignor, coordinator, members (with their assignments and, for
    consumer groups, target assignments) and the lag of every committed partition; for a
    share group its members and share-partitions (start offset, in-flight records)."""
    endpoint = _endpoint(bootstrap_server, dir)
    if print_share_group(group_id, *endpoint, dir, format):
        return
    admin = _admin(bootstrap_server, dir)
    try:
        d = admin.describe_consumer_groups([group_id], request_timeout=ADMIN_TIMEOUT_S)[
            group_id
        ].result(ADMIN_TIMEOUT_S)
        lag = _lag(admin, group_id)
    except Exception as exc:  # confluent-kafka: KafkaException, timeouts
        fail(f"describing group {group_id!r} failed: {client_error_text(exc)}")
    group_type = _name(d.type).lower()
    epochs = _epochs(endpoint, group_id) if group_type == "consumer" else {}
    member_epochs = epochs.get("member_epochs", {})
    group = {
        "group": d.group_id,
        "type": group_type,
        "state": _state(d.state, group_type),
        "assignor": d.partition_assignor,
        "coordinator": d.coordinator.id if d.coordinator is not None else None,
        "group_epoch": epochs.get("group_epoch"),
        "assignment_epoch": epochs.get("assignment_epoch"),
        "members": [
            {
                "member_id": m.member_id,
                "member_epoch": member_epochs.get(m.member_id),
                "instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": _partitions(m.assignment),
                "target_assignment": _partitions(m.target_assignment),
            }
            for m in d.members
        ],
        "offsets": lag,
    }
    if print_data(group, format):
        return
    epoch_text = ""
    if group["type"] == "consumer":
        epoch_text = (
            f", group epoch {_text(group['group_epoch'])}, assignment epoch "
            f"{_text(group['assignment_epoch'])}"
        )
    console.print(
        f"group {group['group']}: type {group['type']}, state {group['state']}{epoch_text}, "
        f"assignor {group['assignor'] or '-'}, coordinator {group['coordinator']}, "
        f"{len(d.members)} members"
    )
    members = Table(title="members")
    for col in ("member", "epoch", "instance", "client", "host", "assigned", "target"):
        members.add_column(col)
    for m in group["members"]:
        members.add_row(
            m["member_id"],
            _text(m["member_epoch"]),
            m["instance_id"] or "-",
            m["client_id"],
            m["host"],
            _compact(m["assignment"]),
            _compact(m["target_assignment"]) if group["type"] == "consumer" else "-",
        )
    console.print(members)
    offsets = Table(title="offsets")
    for col in ("topic", "partition", "committed", "end", "lag"):
        offsets.add_column(col)
    for r in lag:
        offsets.add_row(
            r["topic"], str(r["partition"]), str(r["committed"]), str(r["end"]), str(r["lag"])
        )
    console.print(offsets)


def _epochs(endpoint: tuple[str, dict | None], group_id: str) -> dict:
    """A consumer group's epochs (ConsumerGroupDescribe at its coordinator); {} when they
    cannot be asked (a SASL listener, the coordinator moved): the rest is still shown."""
    try:
        return consumer_group_epochs(endpoint[0], group_id, endpoint[1]) or {}
    except ShareDescribeError:
        return {}


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _group(row: dict) -> str:
    return row["group"]


def _compact(parts: list[dict]) -> str:
    by_topic: dict[str, list[int]] = {}
    for p in parts:
        by_topic.setdefault(p["topic"], []).append(p["partition"])
    return (
        " ".join(f"{t}:{','.join(map(str, sorted(ps)))}" for t, ps in sorted(by_topic.items()))
        or "-"
    )
