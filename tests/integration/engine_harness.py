"""Helpers to run the storage engine against a real quorum and a real SeaweedFS."""

from __future__ import annotations

import uuid
from pathlib import Path

from controlplane.client import ControllerClient
from dataplane.config import StorageConfig, WALConfig
from dataplane.objectstore import ObjectStorage, parse_bucket_uris
from dataplane.objectstore.seaweed import EmbeddedSeaweed
from dataplane.s3stream.storage import S3Storage


def bucket_uris(store: EmbeddedSeaweed) -> str:
    c = store.config
    common = (
        f"region=us-east-1&endpoint={c.endpoint}&accessKey={c.access_key}&secretKey={c.secret_key}"
    )
    return f"0@s3://automq-main?{common},1@s3://automq-failover?{common}"


def register(client: ControllerClient, node_id: int) -> int:
    """Register a node (new epoch) and unfence it with a heartbeat."""
    epoch = client.call(
        "register_broker",
        {
            "node_id": node_id,
            "az": "az1",
            "host": "127.0.0.1",
            "kafka_port": 1,
            "incarnation_id": uuid.uuid4().hex,
        },
    )["node_epoch"]
    client.call("broker_heartbeat", {"node_id": node_id, "node_epoch": epoch})
    return epoch


def make_engine(
    client: ControllerClient, store: EmbeddedSeaweed, data_dir: Path, node_id: int, **config
) -> S3Storage:
    epoch = register(client, node_id)
    # the engine keeps many reads in flight (readahead of every reader): a wider pool than
    # the object store's default of 16
    objects = ObjectStorage(parse_bucket_uris(bucket_uris(store)), max_concurrency=64)
    wal = WALConfig(capacity_bytes=config.pop("wal_capacity_bytes", 64 << 20))
    return S3Storage(
        StorageConfig(**config), node_id, epoch, client, objects, data_dir=data_dir, wal=wal
    )
