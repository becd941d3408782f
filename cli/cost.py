"""`automqctl cost`: the cluster's data traffic and its cross-AZ cost, against Kafka.

Sums the zone router's byte counters every broker reports with its heartbeats
(`dataplane/zonerouter/traffic.py`; counted since each broker started) and prices the
cross-AZ bytes (clients' data, and the brokers' own requests to brokers of other AZs) at
`--price-per-gb` (AWS: $0.01/GB out + $0.01/GB in = $0.02/GB) against a
Kafka deployment with 3 replicas over 3 AZs carrying the same traffic: clients spread evenly
over the AZs reach a leader in another AZ 2/3 of the time, and each produced byte is
replicated to 2 followers in the other AZs (no follower fetching).

Client bytes are split by whether the client declared its AZ: `cross_az_bytes` are the
declared ones' bytes served across AZs (`known_az_cost_usd`); those of clients that declare
none (`unknown_az_client_bytes`) are priced like Kafka's clients (`unknown_az_cost_usd`), and
`unknown_az_cost_if_routed_usd` is what they would cost declared (routed within their AZ).
`cross_az_cost_usd` is the sum of the known, the unknown and the brokers' own.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from cli.options import DirOption, open_cluster
from cli.output import OutputFormat, console, fail, print_data

GB = 10**9
KAFKA_REPLICAS_CROSS_AZ = 2  # 3 replicas in 3 AZs: two copies leave the leader's AZ
CLIENT_OTHER_AZ_SHARE = 2 / 3  # a client in one of 3 AZs, its leader in another


def cost_report(traffic: dict[int, dict[str, int] | None], price_per_gb: float) -> dict:
    """The cluster's sums and dollar estimates from each broker's counters (pure)."""
    sums: Counter = Counter()
    reporting = 0
    for counters in traffic.values():
        if counters:
            reporting += 1
            sums.update({k: int(v) for k, v in counters.items()})
    produced, consumed = sums["produced_bytes"], sums["consumed_bytes"]
    unknown = sums["produced_unknown_az_bytes"] + sums["consumed_unknown_az_bytes"]
    cross = sums["produced_cross_az_bytes"] + sums["consumed_cross_az_bytes"]
    # brokers' own requests to brokers of other AZs (zone routes, snapshot polls, forwarded
    # coordinator and admin requests): metadata and control, no record data
    broker_cross = sums["broker_cross_az_bytes"]
    # clients that did not declare an AZ are assumed spread like Kafka's
    unknown_cross = unknown * CLIENT_OTHER_AZ_SHARE
    cross_estimated = cross + broker_cross + unknown_cross
    kafka_cross = (
        produced * (CLIENT_OTHER_AZ_SHARE + KAFKA_REPLICAS_CROSS_AZ)
        + consumed * CLIENT_OTHER_AZ_SHARE
    )
    client_bytes = produced + consumed
    known = max(0, client_bytes - unknown)
    # declared, they would be routed like the clients that declare theirs: the same share
    # crossing AZs as those (none when every AZ has a broker)
    routed_cross = unknown * (cross / known) if known else 0.0
    return {
        "brokers_reporting": reporting,
        "produced_bytes": produced,
        "consumed_bytes": consumed,
        "known_az_client_bytes": known,
        "cross_az_bytes": cross,
        "known_az_cost_usd": _usd(cross, price_per_gb),
        "unknown_az_client_bytes": unknown,
        "unknown_az_estimated_cross_az_bytes": round(unknown_cross),
        "unknown_az_cost_usd": _usd(unknown_cross, price_per_gb),
        "unknown_az_cost_if_routed_usd": _usd(routed_cross, price_per_gb),
        "cross_az_ratio": (cross / client_bytes) if client_bytes else 0.0,
        "broker_cross_az_bytes": broker_cross,
        "broker_cross_az_ratio": (broker_cross / client_bytes) if client_bytes else 0.0,
        "wal_data_bytes": sums["wal_data_bytes"],
        "wal_data_bytes_per_produced_byte": (sums["wal_data_bytes"] / produced)
        if produced
        else 0.0,
        "proxy_read_bytes": sums["proxy_read_bytes"],
        "object_store_put_bytes": sums["object_store_put_bytes"],
        "price_per_gb_usd": price_per_gb,
        "broker_cross_az_cost_usd": _usd(broker_cross, price_per_gb),
        "cross_az_cost_usd": _usd(cross_estimated, price_per_gb),
        "kafka_cross_az_bytes": round(kafka_cross),
        "kafka_cross_az_cost_usd": _usd(kafka_cross, price_per_gb),
    }


def _usd(crossing_bytes: float, price_per_gb: float) -> float:
    return round(crossing_bytes / GB * price_per_gb, 6)


def unknown_az_note(report: dict) -> str | None:
    """What the clients that declare no AZ cost, and would cost declared (None if there
    are none): the explanation of a cross-AZ cost beside `cross_az_bytes 0`."""
    unknown = report["unknown_az_client_bytes"]
    if not unknown:
        return None
    share = unknown / max(1, report["produced_bytes"] + report["consumed_bytes"])
    return (
        f"{_size(unknown)} ({share:.0%}) of the client bytes came from clients that "
        "declare no AZ (client.id ...&automq_az=<az>, or the brokers' "
        "zone_router.client_az_cidrs): they are not in cross_az_bytes and are priced like "
        f"Kafka's clients (2/3 cross AZs): {_dollars(report['unknown_az_cost_usd'])} of "
        f"cross_az_cost_usd {_dollars(report['cross_az_cost_usd'])}; declaring their AZ, "
        f"they would cost {_dollars(report['unknown_az_cost_if_routed_usd'])} (routed to "
        "brokers of their AZ)"
    )


def _size(n_bytes: int) -> str:
    for unit, size in (("GB", GB), ("MB", 10**6), ("KB", 10**3)):
        if n_bytes >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{n_bytes} bytes"


def _dollars(usd: float) -> str:
    """$0, $12.34, or $0.000027 (the estimates are rounded to 6 decimals)."""
    if usd == 0:
        return "$0"
    return f"${usd:,.2f}" if usd >= 0.01 else f"${usd:.6f}"


def cost(
    dir: Path = DirOption,
    price_per_gb: float = typer.Option(
        0.02, "--price-per-gb", min=0.0, max=100.0, help="USD per GB crossing AZs"
    ),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Produced, consumed, cross-AZ, WAL and object-store bytes of the cluster (since each
    broker started), and the cross-AZ cost against Kafka with 3 replicas over 3 AZs."""
    from cli.status import collect_status

    cluster, config = open_cluster(dir)
    status = collect_status(cluster, config)
    if status.get("leader") is None:
        fail("no controller leader answers: the brokers' counters are unknown")
    report = cost_report(
        {b["node_id"]: b.get("zone_traffic") for b in status["brokers"]}, price_per_gb
    )
    if print_data(report, format):
        return
    table = Table("metric", "value")
    for key, value in report.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    note = unknown_az_note(report)
    if note:
        console.print(f"note: {escape(note)}", soft_wrap=True)
