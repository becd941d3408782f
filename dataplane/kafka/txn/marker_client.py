"""WriteTxnMarkers to another broker (the transaction coordinator -> partition leaders).

One blocking request per call on a fresh connection: markers are written once per
transaction end, per broker, so a pool would save little; bounded by `timeout_s`.

The connection logs in as the broker principal (`interbroker.InterBrokerLogin`: SASL and/or
TLS, following the inter-broker listener): WriteTxnMarkers needs CLUSTER_ACTION on a
cluster with ACLs (dataplane/kafka/security/enforcement.py).
"""

from __future__ import annotations

from kafka.protocol.producer import WriteTxnMarkersRequest

from dataplane.kafka.interbroker import InterBrokerLogin, connect, roundtrip

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"  # a group's marker target: (this, slot)
WRITE_TXN_MARKERS_VERSION = 1


def send_write_txn_markers(
    host: str,
    port: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[tuple[str, int]],
    timeout_s: float,
    login: InterBrokerLogin | None = None,
) -> dict[tuple[str, int], int]:
    """Send one marker for `partitions` to the broker at host:port; error per partition.
    Raises OSError/ConnectionError (InterBrokerAuthError, ssl.SSLError) when the broker
    cannot be reached or refuses the login."""
    R = WriteTxnMarkersRequest
    topics: dict[str, list[int]] = {}
    for topic, p in partitions:
        topics.setdefault(topic, []).append(p)
    req = R[WRITE_TXN_MARKERS_VERSION](
        markers=[
            R.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transaction_result=commit,
                topics=[
                    R.WritableTxnMarker.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                    for t, ps in topics.items()
                ],
                coordinator_epoch=coordinator_epoch,
            )
        ]
    )
    with connect(host, port, timeout_s, login) as sock:
        resp = roundtrip(sock, req, int(R.API_KEY), WRITE_TXN_MARKERS_VERSION)
    out: dict[tuple[str, int], int] = {}
    for marker in resp.markers:
        for t in marker.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index)] = p.error_code
    return out
