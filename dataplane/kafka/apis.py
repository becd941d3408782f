"""The broker's Kafka APIs on top of partition backends and the metadata image: `KafkaApis`,
the one object the broker constructs, composes the handlers by concept:

- `data_apis.py`: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch;
- `metadata_apis.py`: Metadata, DescribeCluster, FindCoordinator, InitProducerId;
- `topic_admin_apis.py`: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
  AlterConfigs, IncrementalAlterConfigs;

on the state they share (`api_context.BrokerApiContext`, which `KafkaApis` is).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from controlplane.calls import ControllerCalls
from controlplane.image import MetadataImage
from dataplane.kafka.api_context import BrokerApiContext, BrokerIdentity, TopicCreation
from dataplane.kafka.data_apis import DataApis
from dataplane.kafka.metadata_apis import MetadataApis
from dataplane.kafka.network_limits import NetworkLimits
from dataplane.kafka.partition_backend import ClientRouting, DirectRouting, PartitionResolver
from dataplane.kafka.share.partitions import ShareSettings
from dataplane.kafka.topic_admin_apis import TopicAdminApis

if TYPE_CHECKING:
    from dataplane.kafka.txn.handlers import TxnHandlers


class KafkaApis(BrokerApiContext):
    """Handlers of the broker's data, metadata and topic admin APIs: `data`, `cluster` and
    `topic_admin`, on this object's shared state."""

    def __init__(
        self,
        me: BrokerIdentity,
        image_fn: Callable[[], MetadataImage],
        wait_for_offset: Callable[[int, float], bool],
        controller: ControllerCalls,
        partitions: PartitionResolver,
        node_epoch_fn: Callable[[], int],
        io_threads: int = 16,
        routing: ClientRouting | None = None,
        io_pool: Executor | None = None,
        txn: TxnHandlers | None = None,
        topic_creation: TopicCreation = TopicCreation(),
        network: NetworkLimits | None = None,
        share_defaults: ShareSettings | None = None,
    ):
        super().__init__(
            me,
            image_fn,
            wait_for_offset,
            controller,
            partitions,
            routing or DirectRouting(partitions),
            # engine calls may block on S3 or the controller: keep them off the event loop
            io_pool or ThreadPoolExecutor(io_threads, thread_name_prefix="kafka-io"),
            topic_creation,
            network,
        )
        self.node_epoch_fn = node_epoch_fn
        # the transaction APIs (dataplane/kafka/txn/handlers.py `TxnHandlers`), None without
        # transactions; InitProducerId with a transactional id goes there
        self.txn = txn
        self.data = DataApis(self)
        self.cluster = MetadataApis(self, node_epoch_fn, lambda: self.txn)
        # share groups' settings where a group sets none (its DescribeConfigs defaults)
        self.topic_admin = TopicAdminApis(self, share_defaults)

    def registrations(self) -> list:
        """(request class, min version, max version, handler) for the API registry."""
        return [
            (MetadataRequest, 0, 12, self.cluster.metadata),
            (ProduceRequest, 3, 11, self.data.produce),
            (FetchRequest, 4, 16, self.data.fetch),
            (ListOffsetsRequest, 1, 8, self.data.list_offsets),
            (OffsetForLeaderEpochRequest, 2, 4, self.data.offset_for_leader_epoch),
            (CreateTopicsRequest, 2, 7, self.topic_admin.create_topics),
            (DeleteTopicsRequest, 1, 6, self.topic_admin.delete_topics),
            (CreatePartitionsRequest, 0, 3, self.topic_admin.create_partitions),
            (DescribeConfigsRequest, 1, 4, self.topic_admin.describe_configs),
            (AlterConfigsRequest, 0, 2, self.topic_admin.alter_configs),
            (IncrementalAlterConfigsRequest, 0, 1, self.topic_admin.incremental_alter_configs),
            (FindCoordinatorRequest, 0, 4, self.cluster.find_coordinator),
            (InitProducerIdRequest, 0, 4, self.cluster.init_producer_id),
            (DescribeClusterRequest, 0, 2, self.cluster.describe_cluster),
        ]
