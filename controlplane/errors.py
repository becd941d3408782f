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


class ControllerError(Exception):
    """A request the controller refused; `code` is stable, `message` is for people."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    def to_dict(self) -> dict:
        return {"error": {"code": self.code.value, "message": self.message}}
