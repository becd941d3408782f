"""Share groups (KIP-932) for `automqctl group list|describe`: confluent-kafka's admin
client has no share-group calls, so these speak ShareGroupDescribe (api key 77) to the
group's coordinator themselves (FindCoordinator first), over PLAINTEXT or TLS - and
ConsumerGroupDescribe (69) for a KIP-848 group's epochs, which librdkafka's
describe_consumer_groups does not hand out; and read the
share-partitions' durable state (start offset, end offset, records by state) from the
controller's metadata (`share-state/<group>/...` entries, `controlplane/share_state.py`).
Records acquired but not yet acknowledged are stored as available: the in-flight counts
are what a restart would recover.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from pathlib import Path
from typing import Any

from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from dataplane.formats import consumer_group_messages, share_messages
from dataplane.formats.kafka_errors import KafkaError

TIMEOUT_S = 10.0
MAX_SHARE_GROUPS = 1_000
MAX_FRAME_BYTES = 64 * 1024 * 1024
_RESPONSES = {
    3: MetadataResponse,
    10: FindCoordinatorResponse,
    69: consumer_group_messages.ConsumerGroupDescribeResponse,
    77: share_messages.ShareGroupDescribeResponse,
    602: share_messages.DescribeSharePartitionsResponse,
}
_STATE_NAMES = {0: "available", 1: "acquired", 2: "acknowledged", 4: "archived"}


class ShareDescribeError(Exception):
    """The share group could not be described (no coordinator, unreachable, an error)."""


def _call(address: str, request: Any, api_key: int, version: int, security: dict | None) -> Any:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    try:
        if security and security.get("security_protocol") == "SSL":
            ctx = ssl.create_default_context(cafile=security.get("ssl_ca_file"))
            if security.get("ssl_cert_file"):
                ctx.load_cert_chain(security["ssl_cert_file"], security.get("ssl_key_file"))
            sock = ctx.wrap_socket(sock, server_hostname=host)
        request.API_VERSION = version
        request.with_header(correlation_id=1, client_id="automqctl")
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        size = struct.unpack(">i", _read(sock, 4))[0]
        if not 0 < size <= MAX_FRAME_BYTES:
            raise ShareDescribeError(f"bad response size {size} from {address}")
        return _RESPONSES[api_key][version].decode(_read(sock, size), header=True)
    finally:
        sock.close()


def _read(sock: socket.socket, count: int) -> bytes:
    chunks, got = [], 0
    while got < count:
        chunk = sock.recv(count - got)
        if not chunk:
            raise ShareDescribeError("connection closed by the broker")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def coordinator_call(
    bootstrap: str, group_id: str, request: Any, api_key: int, version: int, security: dict | None
) -> tuple[Any, Any, list]:
    """(the group's coordinator as FindCoordinator names it, its answer to `request`, the
    cluster's brokers): asked of the first bootstrap server that answers. ShareDescribeError
    when none can be asked (SASL clusters too: these calls speak PLAINTEXT or TLS only)."""
    from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest

    if security and security.get("security_protocol", "").startswith("SASL"):
        raise ShareDescribeError("groups are described here over PLAINTEXT or SSL listeners")
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    last_error: Exception | None = None
    for address in addresses:
        try:
            found = _call(
                address,
                FindCoordinatorRequest[4](key_type=0, coordinator_keys=[group_id]),
                10,
                4,
                security,
            ).coordinators[0]
            if found.error_code != KafkaError.NONE:
                raise ShareDescribeError(f"no coordinator for {group_id!r} ({found.error_code})")
            resp = _call(f"{found.host}:{found.port}", request, api_key, version, security)
            brokers = _call(address, MetadataRequest[1](topics=[]), 3, 1, security).brokers
        except (OSError, ShareDescribeError) as exc:
            last_error = exc
            continue
        return found, resp, list(brokers)
    raise ShareDescribeError(f"no broker answered: {last_error}")


def _described_group(resp: Any, api_name: str) -> Any | None:
    """The one group of a ShareGroupDescribe or ConsumerGroupDescribe (`api_name`) answer;
    None when it is no group of that type (GROUP_ID_NOT_FOUND), ShareDescribeError for any
    other error."""
    g = resp.groups[0]
    if g.error_code == KafkaError.GROUP_ID_NOT_FOUND:
        return None
    if g.error_code != KafkaError.NONE:
        raise ShareDescribeError(f"{api_name} error {g.error_code}: {g.error_message}")
    return g


def describe_share_group(
    bootstrap: str, group_id: str, security: dict | None
) -> dict[str, Any] | None:
    """The share group's state, epoch and members (with assignments); None if the group is
    not a share group. ShareDescribeError when it cannot be asked (SASL clusters too)."""
    request = share_messages.ShareGroupDescribeRequest(
        version=1, group_ids=[group_id], include_authorized_operations=False
    )
    found, resp, brokers = coordinator_call(bootstrap, group_id, request, 77, 1, security)
    g = _described_group(resp, "ShareGroupDescribe")
    if g is None:
        return None
    return {
        "group": g.group_id,
        "type": "share",
        "state": g.group_state,
        "group_epoch": g.group_epoch,
        "assignor": g.assignor_name,
        "coordinator": found.node_id,
        "brokers": brokers,
        "members": [
            {
                "member_id": m.member_id,
                "member_epoch": m.member_epoch,
                "client_id": m.client_id,
                "host": m.client_host,
                "assignment": [
                    {"topic": tp.topic_name, "partition": p}
                    for tp in m.assignment.topic_partitions
                    for p in tp.partitions
                ],
            }
            for m in g.members
        ],
    }


def consumer_group_epochs(
    bootstrap: str, group_id: str, security: dict | None
) -> dict[str, Any] | None:
    """A KIP-848 consumer group's group epoch, assignment epoch and member epochs (by member
    id), from ConsumerGroupDescribe (69) at its coordinator: what librdkafka's
    describe_consumer_groups does not hand out. None if it is not a consumer group (a classic
    one); ShareDescribeError when it cannot be asked."""
    request = consumer_group_messages.ConsumerGroupDescribeRequest[0](
        group_ids=[group_id], include_authorized_operations=False
    )
    _, resp, _ = coordinator_call(bootstrap, group_id, request, 69, 0, security)
    g = _described_group(resp, "ConsumerGroupDescribe")
    if g is None:
        return None
    return {
        "group_epoch": g.group_epoch,
        "assignment_epoch": g.assignment_epoch,
        "member_epochs": {m.member_id: m.member_epoch for m in g.members},
    }


def live_share_partitions(
    brokers: list[str], group_id: str, security: dict | None
) -> list[dict[str, Any]]:
    """The group's share-partitions as their leaders hold them now (DescribeSharePartitions,
    api key 602, asked of every broker; the highest leader epoch wins a partition)."""
    best: dict[tuple[str, int], tuple[int, dict]] = {}
    for address in brokers:
        try:
            resp = _call(
                address,
                share_messages.DescribeSharePartitionsRequest(version=0, group_id=group_id),
                602,
                0,
                security,
            )
        except (OSError, ShareDescribeError):
            continue
        for p in resp.partitions:
            row = {
                "topic": p.topic_name,
                "partition": p.partition,
                "start_offset": p.start_offset,
                "end_offset": p.end_offset,
                "in_flight": {
                    k: v
                    for k, v in (
                        ("available", p.available),
                        ("acquired", p.acquired),
                        ("acknowledged", p.acknowledged),
                        ("archived", p.archived),
                    )
                    if v
                },
            }
            key = (p.topic_name, p.partition)
            if key not in best or best[key][0] < p.leader_epoch:
                best[key] = (p.leader_epoch, row)
    return [row for _, (_, row) in sorted(best.items())]


def share_partitions(image: Any, group_id: str) -> list[dict[str, Any]]:
    """The group's share-partitions as last stored: topic, partition, start offset (SPSO),
    end offset and in-flight records by state."""
    from controlplane.share_state import SHARE_STATE_KEY_PREFIX

    prefix = f"{SHARE_STATE_KEY_PREFIX}{group_id}/"
    rows = []
    for key, value in image.kv.items():
        if not key.startswith(prefix) or not value:
            continue
        topic_id, _, partition = key[len(prefix) :].rpartition("/")
        try:
            doc = json.loads(value)
        except ValueError:
            continue
        counts: dict[str, int] = {}
        end = doc.get("start", 0)
        for first, last, state, _count in doc.get("runs", []):
            name = _STATE_NAMES.get(state, str(state))
            counts[name] = counts.get(name, 0) + last - first + 1
            end = max(end, last + 1)
        topic = image.topics.get(topic_id)
        rows.append(
            {
                "topic": topic.name if topic is not None else topic_id,
                "partition": int(partition),
                "start_offset": doc.get("start", 0),
                "end_offset": end,
                "in_flight": counts,
            }
        )
    return sorted(rows, key=lambda r: (r["topic"], r["partition"]))


def image_of(dir: Path, controllers: str | None = None) -> Any | None:
    """The controller's metadata image of the local cluster in `dir` (None if unreachable)."""
    from cli.options import controller_client
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.image import MetadataImage

    try:
        return MetadataImage.model_validate(controller_client(dir, controllers).image())
    except (ControllerUnavailableError, ControllerError, SystemExit):
        return None


def share_rows(admin: Any, listed: list[dict], bootstrap: str, security: dict | None) -> list:
    """The share groups among every broker's groups (ListGroups v0 names all types) that
    `listed` does not hold: rows of group, type "share", state."""
    import warnings

    known = {r["group"] for r in listed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the only call that lists all
        ids = sorted({g.id for g in admin.list_groups(timeout=TIMEOUT_S)} - known)
    rows = []
    for group_id in ids[:MAX_SHARE_GROUPS]:
        try:
            found = describe_share_group(bootstrap, group_id, security)
        except ShareDescribeError:
            continue
        if found is not None:
            rows.append({"group": group_id, "type": "share", "state": found["state"]})
    return rows


def print_share_group(
    group_id: str, bootstrap: str, security: dict | None, dir: Path, format: Any
) -> bool:
    """Print `group_id` if it is a share group (members, share-partitions); whether it was."""
    from rich.table import Table

    from cli.output import console, print_data

    try:
        group = describe_share_group(bootstrap, group_id, security)
    except ShareDescribeError:
        return False
    if group is None:
        return False
    brokers = [f"{b.host}:{b.port}" for b in group.pop("brokers", [])]
    group["partitions"] = live_share_partitions(brokers, group_id, security)
    if not group["partitions"]:  # no leader holds them loaded: what is stored
        image = image_of(dir)
        group["partitions"] = share_partitions(image, group_id) if image is not None else []
    if print_data(group, format):
        return True
    console.print(
        f"group {group['group']}: type share, state {group['state']}, epoch "
        f"{group['group_epoch']}, assignor {group['assignor']}, coordinator "
        f"{group['coordinator']}, {len(group['members'])} members"
    )
    members = Table(title="members")
    for col in ("member", "epoch", "client", "host", "assigned"):
        members.add_column(col)
    for m in group["members"]:
        assigned = " ".join(f"{a['topic']}:{a['partition']}" for a in m["assignment"]) or "-"
        members.add_row(m["member_id"], str(m["member_epoch"]), m["client_id"], m["host"], assigned)
    console.print(members)
    parts = Table(title="share-partitions")
    for col in ("topic", "partition", "start offset", "end offset", "in flight"):
        parts.add_column(col)
    for p in group["partitions"]:
        flight = " ".join(f"{k} {v}" for k, v in sorted(p["in_flight"].items())) or "-"
        parts.add_row(
            p["topic"], str(p["partition"]), str(p["start_offset"]), str(p["end_offset"]), flight
        )
    console.print(parts)
    return True
