"""Typed controller commands: request models in, response models out.

`ControllerCalls` is the typed face of the controller API: one method per command, taking the
command's request model from `requests.py` and returning its response model. It needs only
`call(command, body, timeout_s)` from the class it is mixed into, so the transport is
pluggable: `ControllerClient` (HTTP to the quorum's leader) and `InProcessController` (the
state machine in this process, for fast tests) both have it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from controlplane.errors import ControllerError, ErrorCode
from controlplane.requests import (
    AllocateProducerIdsRequest,
    AllocateProducerIdsResponse,
    AlterBrokerConfigsRequest,
    AlterBrokerConfigsResponse,
    AlterScramCredentialsRequest,
    AlterScramCredentialsResponse,
    AlterTopicConfigsRequest,
    AlterTopicConfigsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CloseStreamRequest,
    CommitResponse,
    CommitStreamSetObjectRequest,
    CompleteWALFailoverRequest,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateStreamRequest,
    CreateStreamResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteTopicRequest,
    FenceBrokerRequest,
    OpenStreamRequest,
    OpenStreamResponse,
    PrepareObjectsRequest,
    PrepareObjectsResponse,
    PutGroupOffsetsRequest,
    PutTxnStateRequest,
    RecordAbortedTxnsRequest,
    RecordAbortedTxnsResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    RegisterCompactorRequest,
    RegisterCompactorResponse,
    SealErasureRangeRequest,
    SetActiveBucketRequest,
    SetActiveBucketResponse,
    SetCleanerCheckpointsRequest,
    SetCleanerCheckpointsResponse,
    TrimErasureStreamRequest,
    TrimStreamRequest,
    _Request,
    validation_message,
)

if TYPE_CHECKING:
    from controlplane.share_state import (
        AlterShareGroupStateRequest,
        DeleteShareGroupStateRequest,
        PutShareStateRequest,
    )

R = TypeVar("R", bound=BaseModel)
Q = TypeVar("Q", bound=_Request)


def build_request(model: type[Q], **fields: Any) -> Q:
    """A request model from values a client sent (a topic name, a partition count): a bad
    value is the controller's own INVALID_REQUEST, as if the controller had refused it."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ControllerError(ErrorCode.INVALID_REQUEST, validation_message(exc)) from None


class ControllerCalls:
    """Typed commands over `call` (see the module docstring). Thread-safety: as `call`."""

    def call(
        self, command: str, body: dict | BaseModel, timeout_s: float | None = None
    ) -> dict[str, Any]:  # pragma: no cover - provided by the transport
        raise NotImplementedError

    # reads, also provided by the transport (any controller may answer them)
    def read_log(
        self,
        after_offset: int,
        max_records: int = 1000,
        wait_ms: int = 0,
        address: str | None = None,
    ) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def image(self) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def stream(self, stream_id: int) -> dict[str, Any]:  # pragma: no cover
        """A stream's epoch, state, owner, start and end offsets."""
        raise NotImplementedError

    def stream_objects(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int,
        limit: int = 100,
        from_leader: bool = False,
    ) -> list[dict[str, Any]]:  # pragma: no cover
        """Committed objects holding offsets [start, end) of a stream, in offset order.
        Any controller may answer, a follower from an image that lags the last commits;
        `from_leader`: only the leader answers (every commit it acknowledged is in it)."""
        raise NotImplementedError

    def send(self, req: _Request, timeout_s: float | None = None) -> dict[str, Any]:
        """Any command by its request model; the raw result."""
        return self.call(req.command, req, timeout_s)

    def _typed(self, req: _Request, response: type[R], timeout_s: float | None = None) -> R:
        return response.model_validate(self.send(req, timeout_s))

    # brokers
    def register_broker(
        self, req: RegisterBrokerRequest, timeout_s: float | None = None
    ) -> RegisterBrokerResponse:
        return self._typed(req, RegisterBrokerResponse, timeout_s)

    def broker_heartbeat(
        self, req: BrokerHeartbeatRequest, timeout_s: float | None = None
    ) -> BrokerHeartbeatResponse:
        return self._typed(req, BrokerHeartbeatResponse, timeout_s)

    def fence_broker(self, req: FenceBrokerRequest, timeout_s: float | None = None) -> None:
        self.send(req, timeout_s)

    def controlled_shutdown(
        self, req: ControlledShutdownRequest, timeout_s: float | None = None
    ) -> ControlledShutdownResponse:
        return self._typed(req, ControlledShutdownResponse, timeout_s)

    def complete_wal_failover(
        self, req: CompleteWALFailoverRequest, timeout_s: float | None = None
    ) -> None:
        self.send(req, timeout_s)

    def allocate_producer_ids(
        self, req: AllocateProducerIdsRequest, timeout_s: float | None = None
    ) -> AllocateProducerIdsResponse:
        return self._typed(req, AllocateProducerIdsResponse, timeout_s)

    # topics
    def create_topic(
        self, req: CreateTopicRequest, timeout_s: float | None = None
    ) -> CreateTopicResponse:
        return self._typed(req, CreateTopicResponse, timeout_s)

    def delete_topic(self, req: DeleteTopicRequest, timeout_s: float | None = None) -> None:
        self.send(req, timeout_s)

    def create_partitions(
        self, req: CreatePartitionsRequest, timeout_s: float | None = None
    ) -> None:
        self.send(req, timeout_s)

    def alter_topic_configs(
        self, req: AlterTopicConfigsRequest, timeout_s: float | None = None
    ) -> AlterTopicConfigsResponse:
        return self._typed(req, AlterTopicConfigsResponse, timeout_s)

    def alter_broker_configs(
        self, req: AlterBrokerConfigsRequest, timeout_s: float | None = None
    ) -> AlterBrokerConfigsResponse:
        return self._typed(req, AlterBrokerConfigsResponse, timeout_s)

    # streams and objects
    def create_stream(
        self, req: CreateStreamRequest, timeout_s: float | None = None
    ) -> CreateStreamResponse:
        return self._typed(req, CreateStreamResponse, timeout_s)

    def open_stream(
        self, req: OpenStreamRequest, timeout_s: float | None = None
    ) -> OpenStreamResponse:
        return self._typed(req, OpenStreamResponse, timeout_s)

    def close_stream(self, req: CloseStreamRequest, timeout_s: float | None = None) -> None:
        self.send(req, timeout_s)

    def trim_stream(self, req: TrimStreamRequest, timeout_s: float | None = None) -> None:
        self.send(req, timeout_s)

    def prepare_objects(
        self, req: PrepareObjectsRequest, timeout_s: float | None = None
    ) -> PrepareObjectsResponse:
        return self._typed(req, PrepareObjectsResponse, timeout_s)

    def commit_stream_set_object(
        self, req: CommitStreamSetObjectRequest, timeout_s: float | None = None
    ) -> CommitResponse:
        return self._typed(req, CommitResponse, timeout_s)

    def seal_erasure_range(
        self, req: SealErasureRangeRequest, timeout_s: float | None = None
    ) -> CommitResponse:
        return self._typed(req, CommitResponse, timeout_s)

    def trim_erasure_stream(
        self, req: TrimErasureStreamRequest, timeout_s: float | None = None
    ) -> None:
        self.send(req, timeout_s)

    def register_compactor(
        self, req: RegisterCompactorRequest, timeout_s: float | None = None
    ) -> RegisterCompactorResponse:
        return self._typed(req, RegisterCompactorResponse, timeout_s)

    def set_cleaner_checkpoints(
        self, req: SetCleanerCheckpointsRequest, timeout_s: float | None = None
    ) -> SetCleanerCheckpointsResponse:
        """The log cleaner's checkpoints per compacted partition (compacted topics)."""
        return self._typed(req, SetCleanerCheckpointsResponse, timeout_s)

    def set_active_bucket(
        self, req: SetActiveBucketRequest, timeout_s: float | None = None
    ) -> SetActiveBucketResponse:
        """Switch the bucket new objects go to (object-storage failover)."""
        return self._typed(req, SetActiveBucketResponse, timeout_s)

    # groups
    def put_group_offsets(
        self, req: PutGroupOffsetsRequest, timeout_s: float | None = None
    ) -> None:
        self.send(req, timeout_s)

    def put_share_state(
        self, req: PutShareStateRequest, timeout_s: float | None = None
    ) -> str | None:
        """Store or load a share-partition's state (controlplane/share_state.py): the value
        stored after the command."""
        return self.send(req, timeout_s).get("value")

    def delete_share_group_state(
        self, req: DeleteShareGroupStateRequest, timeout_s: float | None = None
    ) -> int:
        """Delete a share group's stored share-partition states (controlplane/share_state.py):
        how many there were."""
        return int(self.send(req, timeout_s).get("deleted", 0))

    def alter_share_group_state(
        self, req: AlterShareGroupStateRequest, timeout_s: float | None = None
    ) -> int:
        """Replace share-partition states of a share group at a higher state epoch
        (controlplane/share_state.py): how many."""
        return int(self.send(req, timeout_s).get("altered", 0))

    # transactions
    def record_aborted_txns(
        self, req: RecordAbortedTxnsRequest, timeout_s: float | None = None
    ) -> RecordAbortedTxnsResponse:
        """A partition's aborted transactions, kept with its stream (read_committed
        consumers of a later leader skip them)."""
        return self._typed(req, RecordAbortedTxnsResponse, timeout_s)

    def put_txn_state(self, req: PutTxnStateRequest, timeout_s: float | None = None) -> None:
        self.send(req, timeout_s)

    # ------------------------------------------------------------ security (controlplane/security.py)

    def alter_scram_credentials(
        self, req: AlterScramCredentialsRequest, timeout_s: float | None = None
    ) -> AlterScramCredentialsResponse:
        return self._typed(req, AlterScramCredentialsResponse, timeout_s)

    def create_acls(self, req: CreateAclsRequest, timeout_s: float | None = None) -> int:
        """Add ACLs; the metadata offset that holds them."""
        return int(self.send(req, timeout_s)["metadata_offset"])

    def delete_acls(
        self, req: DeleteAclsRequest, timeout_s: float | None = None
    ) -> DeleteAclsResponse:
        return self._typed(req, DeleteAclsResponse, timeout_s)
