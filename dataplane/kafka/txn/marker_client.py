"""WriteTxnMarkers to another broker (the transaction coordinator -> partition leaders).

One blocking request per call on a fresh connection: markers are written once per
transaction end, per broker, so a pool would save little; bounded by `timeout_s`.
"""

from __future__ import annotations

import itertools
import socket
import struct

from kafka.protocol.producer import WriteTxnMarkersRequest

from dataplane.kafka.codec import decode_response, encode_request

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"  # a group's marker target: (this, slot)
WRITE_TXN_MARKERS_VERSION = 1
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_correlation = itertools.count(1)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def send_write_txn_markers(
    host: str,
    port: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[tuple[str, int]],
    timeout_s: float,
) -> dict[tuple[str, int], int]:
    """Send one marker for `partitions` to the broker at host:port; error per partition.
    Raises OSError/ConnectionError when the broker cannot be reached."""
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
    correlation_id = next(_correlation) & 0x7FFFFFFF
    frame = encode_request(
        req, correlation_id, client_id="automq-txn-coordinator", version=WRITE_TXN_MARKERS_VERSION
    )
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(frame)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 0 < size <= MAX_RESPONSE_BYTES:
            raise ConnectionError(f"bad response size {size}")
        _, resp = decode_response(_recv_exact(sock, size), R.API_KEY, WRITE_TXN_MARKERS_VERSION)
    out: dict[tuple[str, int], int] = {}
    for marker in resp.markers:
        for t in marker.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index)] = p.error_code
    return out
