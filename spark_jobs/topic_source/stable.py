"""read_committed's end: each partition's last stable offset (LSO), asked of the brokers.

A transaction still open (no COMMIT/ABORT marker yet) may end in an abort, so a
read_committed read must stop before its first record, as a Kafka consumer stops at the LSO.
The metadata has no LSO; the partition leaders do: one ListOffsets(latest, read_committed)
per read (metadata only: no record goes through a broker). The driver asks it BEFORE it
reads the controller's image, so a transaction that was open then is capped here, and one
that had ended had its marker written (its abort then on its way into the metadata's index).

Kafka client settings come from the `kafka.*` options (Spark's Kafka-source convention:
`kafka.bootstrap.servers`, `kafka.security.protocol`, `kafka.sasl.*`, ...); without
`kafka.bootstrap.servers` the brokers' PLAINTEXT listeners from the metadata are used.
"""

from __future__ import annotations

from controlplane.image import MetadataImage
from spark_jobs.topic_source.options import TopicSourceError

LIST_OFFSETS_TIMEOUT_S = 30.0
MAX_BOOTSTRAP_BROKERS = 16


def bootstrap_from_image(image: MetadataImage) -> str:
    """host:port of the live brokers' PLAINTEXT listeners (their first listener when they
    registered only one)."""
    out = []
    for broker in image.brokers.values():
        if broker.fenced:
            continue
        plain = [e for e in broker.endpoints if e.security_protocol == "PLAINTEXT"]
        if plain:
            out.append(f"{plain[0].host}:{plain[0].port}")
        elif not broker.endpoints:
            out.append(f"{broker.host}:{broker.kafka_port}")
    if not out:
        raise TopicSourceError(
            "read_committed needs the brokers' last stable offsets and no broker has a "
            "PLAINTEXT listener: set kafka.bootstrap.servers and kafka.security.protocol "
            "(and kafka.sasl.* / kafka.ssl.*), or isolation.level=read_uncommitted"
        )
    return ",".join(sorted(out)[:MAX_BOOTSTRAP_BROKERS])


def last_stable_offsets(
    config: dict[str, str], partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """(topic, partition) -> its last stable offset, from the partitions' leaders."""
    if not partitions:
        return {}
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient(config)
    request = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
    try:
        futures = admin.list_offsets(
            request,
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=LIST_OFFSETS_TIMEOUT_S,
        )
        return {
            (tp.topic, tp.partition): f.result(LIST_OFFSETS_TIMEOUT_S).offset
            for tp, f in futures.items()
        }
    except Exception as exc:  # noqa: BLE001 - any failure: the same clear message
        raise TopicSourceError(
            "read_committed needs the partitions' last stable offsets from the brokers "
            f"(ListOffsets at {config.get('bootstrap.servers')}): {exc}; set the kafka.* "
            "options (bootstrap.servers, security), or isolation.level=read_uncommitted"
        ) from None
