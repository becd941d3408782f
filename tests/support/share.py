"""KIP-932 share consumers for the share-group e2e tests (the test module and the
share_member.py process it kills): confluent-kafka's `ShareConsumer` in explicit
acknowledgement mode. Import after `pytest.importorskip("confluent_kafka")`."""

from __future__ import annotations

from confluent_kafka import ShareConsumer


def share_consumer(bootstrap: str, group: str, topic: str, max_records: int) -> ShareConsumer:
    """A share consumer of `group` subscribed to `topic`, acknowledging explicitly, at most
    `max_records` records a poll. The caller closes it."""
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": max_records,
        }
    )
    consumer.subscribe([topic])
    return consumer
