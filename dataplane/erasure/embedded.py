"""Writing to an erasure-coded Kafka partition without a broker on the write path (the
seed's "write agent as an SDK").

`EmbeddedErasureProducer` encodes records as one Kafka record batch and writes it with an
`ErasureWriter` straight to the partition's shard stores (the brokers named in the
partition's metadata, at their registered shard-store ports, with the cluster secret);
Kafka consumers then read it like any produced batch, at the offset the write won. It
follows the brokers' rules for these partitions: offsets are the writer's clock in ns,
multiples of `KAFKA_OFFSET_ALIGNMENT`, so a batch of up to that many records never overlaps
another writer's.

Thread-safe: `send` may be called from several threads (the writer is thread-safe).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from controlplane.erasure_placement import erasure_settings
from controlplane.image import MetadataImage
from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.store import HoleStore, RangeAnswer, WriteAnswer
from dataplane.erasure.store_client import ShardStoreClient, StoreUnavailableError
from dataplane.erasure.writer import ErasureWriter, ShardStore
from dataplane.formats.record_batch import build_batch, zigzag_varint

# records per batch at most; Kafka offsets of erasure partitions are multiples of it
KAFKA_OFFSET_ALIGNMENT = 1 << 16


class BrokerShardStore:
    """The shard store of broker `node_id`: this broker's own HoleStore in process, another
    broker's over HTTP at the address its registration names in the current image (looked
    up on each call, so a restarted broker on a new port is found). Thread-safe."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        local: tuple[int, HoleStore] | None,
        timeout_ms: int,
        secret: str | None = None,
    ):
        self.node_id = node_id
        self.image_fn = image_fn
        self.local = local[1] if local is not None and local[0] == node_id else None
        self.timeout_ms = timeout_ms
        self.secret = secret
        self._clients: dict[str, ShardStoreClient] = {}
        self._lock = threading.Lock()

    def _target(self) -> HoleStore | ShardStoreClient:
        if self.local is not None:
            return self.local
        broker = self.image_fn().brokers.get(self.node_id)
        if broker is None or not broker.shard_store_port:
            raise StoreUnavailableError(f"broker {self.node_id} has no shard store registered")
        address = f"{broker.host}:{broker.shard_store_port}"
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                self._clients = {address: ShardStoreClient(address, self.timeout_ms, self.secret)}
                client = self._clients[address]
        return client

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        return self._target().write(stream_id, offset, data)

    def repair(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        return self._target().repair(stream_id, offset, data)

    def read(self, stream_id: int, offset: int) -> bytes | None:
        return self._target().read(stream_id, offset)

    def read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer:
        return self._target().read_range(stream_id, start, end, max_holes, max_bytes)

    def list_heads(self, stream_id: int, start: int, end: int, max_holes: int) -> RangeAnswer:
        return self._target().list_heads(stream_id, start, end, max_holes)

    def fill_below(self, stream_id: int, mark: int) -> int:
        return self._target().fill_below(stream_id, mark)

    def drop_below(self, stream_id: int, mark: int) -> int:
        return self._target().drop_below(stream_id, mark)

    def find(self, stream_id: int, payload_crc: int) -> list[int]:
        return self._target().find(stream_id, payload_crc)


def _field(data: bytes | None) -> bytes:
    return zigzag_varint(-1) if data is None else zigzag_varint(len(data)) + data


def encode_batch(records: Sequence[tuple[bytes | None, bytes | None]], timestamp_ms: int) -> bytes:
    """One uncompressed v2 record batch (base offset 0) of (key, value) records, all
    stamped `timestamp_ms`, without headers."""
    if not 1 <= len(records) <= KAFKA_OFFSET_ALIGNMENT:
        raise ValueError(f"a batch holds 1..{KAFKA_OFFSET_ALIGNMENT} records, got {len(records)}")
    body = bytearray()
    for delta, (key, value) in enumerate(records):
        record = (
            b"\x00"
            + zigzag_varint(0)
            + zigzag_varint(delta)
            + _field(key)
            + _field(value)
            + zigzag_varint(0)
        )
        body += zigzag_varint(len(record)) + record
    return build_batch(bytes(body), len(records), base_timestamp=timestamp_ms)


class EmbeddedErasureProducer:
    """Writes record batches to one erasure-coded partition's shard stores directly."""

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        topic: str,
        partition: int,
        secret: str | None = None,
        store_timeout_ms: int = 2_000,
        store_for: Callable[[int], ShardStore] | None = None,
    ):
        image = image_fn()
        state = image.topic_by_name(topic)
        if state is None or partition not in state.partitions:
            raise ValueError(f"no partition {topic}-{partition}")
        settings = erasure_settings(state.configs)
        p = state.partitions[partition]
        if settings is None or not p.erasure_coded or len(p.shard_stores) != settings.total_shards:
            raise ValueError(f"{topic}-{partition} is not an erasure-coded partition")
        stores = [
            store_for(n)
            if store_for is not None
            else BrokerShardStore(n, image_fn, None, store_timeout_ms, secret)
            for n in p.shard_stores
        ]
        self.writer = ErasureWriter(
            stores,
            p.stream_id,
            ErasureCodec(settings.data_shards, settings.parity_shards),
            offset_alignment=KAFKA_OFFSET_ALIGNMENT,
        )

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> EmbeddedErasureProducer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(
        self,
        records: Sequence[tuple[bytes | None, bytes | None]],
        timestamp_ms: int | None = None,
    ) -> int:
        """Write (key, value) records as one batch; returns its base offset once k shard
        stores hold it. Raises WriteFailedError when no offset could be won."""
        now_ms = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        return self.writer.append(encode_batch(records, now_ms))


__all__ = [
    "BrokerShardStore",
    "EmbeddedErasureProducer",
    "KAFKA_OFFSET_ALIGNMENT",
    "encode_batch",
]
