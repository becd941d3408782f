"""Error codes of the controller API: every rejected request gets one, and changes nothing."""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    INVALID_REQUEST = "INVALID_REQUEST"
    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
    NOT_CONTROLLER = "NOT_CONTROLLER"
    NO_LEADER = "NO_LEADER"
    TIMEOUT = "TIMEOUT"
    UNKNOWN_NODE = "UNKNOWN_NODE"
    NODE_FENCED = "NODE_FENCED"
    STALE_NODE_EPOCH = "STALE_NODE_EPOCH"
    UNKNOWN_STREAM = "UNKNOWN_STREAM"
    STREAM_FENCED = "STREAM_FENCED"
    STREAM_NOT_OPENED = "STREAM_NOT_OPENED"
    STREAM_NOT_CLOSED = "STREAM_NOT_CLOSED"
    STREAM_OFFSET_GAP = "STREAM_OFFSET_GAP"
    INVALID_OFFSET = "INVALID_OFFSET"
    UNKNOWN_OBJECT = "UNKNOWN_OBJECT"
    OBJECT_NOT_PREPARED = "OBJECT_NOT_PREPARED"
    UNKNOWN_BUCKET = "UNKNOWN_BUCKET"
    TOPIC_ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
    UNKNOWN_TOPIC = "UNKNOWN_TOPIC"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_TOPIC_NAME = "INVALID_TOPIC_NAME"
    NOT_ENOUGH_BROKERS = "NOT_ENOUGH_BROKERS"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    # another node is recovering this node's WAL; register again once it is done
    WAL_FAILOVER_IN_PROGRESS = "WAL_FAILOVER_IN_PROGRESS"
    NOT_FAILOVER_TARGET = "NOT_FAILOVER_TARGET"
    STREAM_IN_USE = "STREAM_IN_USE"  # an orphan close of a stream its partition still needs
    # the requester does not own the group's coordinator slot at that epoch
    NOT_COORDINATOR = "NOT_COORDINATOR"
    # compaction principals: unknown name, or an epoch a newer registration fenced
    UNKNOWN_COMPACTOR = "UNKNOWN_COMPACTOR"
    STALE_COMPACTOR_EPOCH = "STALE_COMPACTOR_EPOCH"
    # a topic config key or value the schema refuses (controlplane/topic_configs.py)
    INVALID_CONFIG = "INVALID_CONFIG"
    # the controller API refused the credential (HTTP 401; controlplane/auth.py)
    UNAUTHORIZED = "UNAUTHORIZED"
    # the leader cannot persist its metadata log (disk full): writes are refused until it can
    LOG_NOT_PERSISTED = "LOG_NOT_PERSISTED"
    # the requester does not lead the partition at that leader epoch (share-partition state)
    NOT_PARTITION_LEADER = "NOT_PARTITION_LEADER"


# A per-stream refusal of a commit that no retry can fix: the stream was deleted, another
# epoch or node owns it, or the data does not continue its committed end. Only that
# stream's data is uncommittable; the other streams of the same upload are fine.
STREAM_PERMANENT_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_STREAM,
        ErrorCode.STREAM_FENCED,
        ErrorCode.STREAM_NOT_OPENED,
        ErrorCode.STREAM_OFFSET_GAP,
        ErrorCode.INVALID_OFFSET,
    }
)
# refusals that say the controller could not decide (leader change, overload): retry as is
RETRIABLE_CODES = frozenset({ErrorCode.NO_LEADER, ErrorCode.TIMEOUT, ErrorCode.NOT_CONTROLLER})
# the writing node itself is fenced: nothing it writes with this node epoch is accepted
NODE_FENCING_CODES = frozenset(
    {ErrorCode.NODE_FENCED, ErrorCode.STALE_NODE_EPOCH, ErrorCode.UNKNOWN_NODE}
)
MAX_STREAM_ERRORS = 10_000  # = requests.MAX_RANGES_PER_COMMIT: one per stream of a commit


class ControllerError(Exception):
    """A request the controller refused; `code` is stable, `message` is for people.

    `stream_errors` (commits only): every stream of the request that was refused, with its
    own code, so the committer can leave exactly those streams out and commit the rest in
    one more round instead of one round per bad stream. `code` is then the first stream's.
    """

    def __init__(
        self, code: ErrorCode, message: str, stream_errors: dict[int, ErrorCode] | None = None
    ):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.stream_errors: dict[int, ErrorCode] = dict(stream_errors or {})

    def to_dict(self) -> dict:
        error: dict = {"code": self.code.value, "message": self.message}
        if self.stream_errors:
            error["stream_errors"] = {
                str(sid): code.value for sid, code in self.stream_errors.items()
            }
        return {"error": error}

    @staticmethod
    def parse_stream_errors(raw: object) -> dict[int, ErrorCode]:
        """`stream_errors` of an error body back to {stream id: code}; unknown codes and
        malformed entries are skipped (a newer controller may know more codes)."""
        out: dict[int, ErrorCode] = {}
        if not isinstance(raw, dict):
            return out
        for sid, code in list(raw.items())[:MAX_STREAM_ERRORS]:
            try:
                out[int(sid)] = ErrorCode(code)
            except (TypeError, ValueError):
                continue
        return out
