"""One broker in this process for API tests: the in-process controller (the real state
machine), the real engine with a temp-dir WAL, moto S3, and the Kafka APIs. No server."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
from moto import mock_aws

from controlplane.inprocess import InProcessController
from dataplane.broker.metadata import MetadataFollower
from dataplane.config import StorageConfig, WALConfig
from dataplane.kafka.api_context import BrokerIdentity, TopicCreation
from dataplane.kafka.apis import KafkaApis
from dataplane.kafka.partition_manager import PartitionManager
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.storage import S3Storage

BUCKETS = "0@s3://automq-main?region=us-east-1"


@contextlib.contextmanager
def inprocess_broker(
    tmp_path: Path,
    topic_creation: TopicCreation = TopicCreation(),
    storage_config: StorageConfig | None = None,
) -> Iterator[tuple[KafkaApis, InProcessController, Callable[[], None]]]:
    """(apis, controller, sync): `sync()` does on the calling thread what the broker's
    follower and reconcile threads do; the APIs also replay the log when they wait for
    their own metadata change (a create or an alter). Needs AWS_* credentials in the env.
    `storage_config`: the engine's (default: small caches)."""
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        controller = InProcessController()
        epoch = controller.call(
            "register_broker",
            {
                "node_id": 1,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9092,
                "incarnation_id": "unit",
            },
        )["node_epoch"]
        controller.call("broker_heartbeat", {"node_id": 1, "node_epoch": epoch})
        objects = ObjectStorage(BUCKETS)
        storage = S3Storage(
            storage_config
            or StorageConfig(block_cache_bytes=16 << 20, log_cache_uploaded_bytes=16 << 20),
            1,
            epoch,
            controller,
            objects,
            data_dir=tmp_path,
            wal=WALConfig(capacity_bytes=32 << 20),
        )
        storage.start()
        partitions = PartitionManager(1, storage)
        # the partition manager follows the image, as the broker process wires it
        follower = MetadataFollower(controller, listeners=[partitions.on_metadata])

        # the manager's passes run on one thread at a time; here the test's thread and the
        # APIs' threads reconcile, one after another, each until its opens are done
        reconcile_lock = threading.Lock()

        def reconcile() -> None:
            with reconcile_lock:
                for opened in partitions.reconcile(follower.image):
                    opened.result()

        def sync() -> None:
            while follower.poll_once():
                pass
            reconcile()

        def image_now():
            if follower.poll_once():
                reconcile()
            return follower.image

        def wait_for_offset(offset: int, timeout_s: float) -> bool:
            image_now()
            return follower.image.offset >= offset

        apis = KafkaApis(
            BrokerIdentity(1, "127.0.0.1", 9092, "az1"),
            image_now,
            wait_for_offset,
            controller,
            partitions,
            lambda: epoch,
            io_threads=2,
            topic_creation=topic_creation,
        )
        try:
            yield apis, controller, sync
        finally:
            apis.io.shutdown(wait=True)
            storage.close()
            objects.close()
