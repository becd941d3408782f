"""Kafka protocol error codes and the exceptions of the wire-protocol framework.

`KafkaError` carries the numeric error codes that travel in response bodies; the names
follow Apache Kafka's ``org.apache.kafka.common.protocol.Errors`` enum (Kafka 4.x), so a
value can be looked up by the name a Kafka developer knows.

The exception classes are raised by the codec (`decode_request`) and by the record-batch
validator (`parse_batches`). They are defined here so that handlers can catch them without
importing the codec, and are re-exported by `codec` and `record_batch`.

Pure module: no I/O, imports nothing from the rest of the project.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "KafkaError",
    "KafkaProtocolError",
    "MalformedRequestError",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "ResponseEncodingError",
    "InvalidRecordBatchError",
]


class KafkaError(IntEnum):
    """Kafka error codes (``Errors.java``); the value is the int16 sent on the wire."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    STALE_CONTROLLER_EPOCH = 11
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    LOG_DIR_NOT_FOUND = 57
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    DELEGATION_TOKEN_AUTH_DISABLED = 61
    DELEGATION_TOKEN_NOT_FOUND = 62
    DELEGATION_TOKEN_OWNER_MISMATCH = 63
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = 64
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = 65
    DELEGATION_TOKEN_EXPIRED = 66
    INVALID_PRINCIPAL_TYPE = 67
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    LISTENER_NOT_FOUND = 72
    TOPIC_DELETION_DISABLED = 73
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
    INCONSISTENT_VOTER_SET = 94
    INVALID_UPDATE_VERSION = 95
    FEATURE_UPDATE_FAILED = 96
    PRINCIPAL_DESERIALIZATION_FAILURE = 97
    SNAPSHOT_NOT_FOUND = 98
    POSITION_OUT_OF_RANGE = 99
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_TOPIC_ID = 103
    INCONSISTENT_CLUSTER_ID = 104
    TRANSACTIONAL_ID_NOT_FOUND = 105
    FETCH_SESSION_TOPIC_ID_ERROR = 106
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108
    OFFSET_MOVED_TO_TIERED_STORAGE = 109
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115
    UNKNOWN_CONTROLLER_ID = 116
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
    INVALID_REGISTRATION = 119
    TRANSACTION_ABORTABLE = 120
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    INVALID_VOTER_KEY = 125
    DUPLICATE_VOTER = 126
    VOTER_NOT_FOUND = 127
    INVALID_REGULAR_EXPRESSION = 128
    REBOOTSTRAP_REQUIRED = 129

    @property
    def retriable(self) -> bool:
        """Whether a client retries on this error (Kafka's RetriableException subclasses)."""
        return self in _RETRIABLE

    @classmethod
    def from_code(cls, code: int) -> KafkaError:
        """The member for ``code``; an unknown code maps to UNKNOWN_SERVER_ERROR (as Kafka clients do)."""
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


# the codes clients retry on (Kafka's RetriableException subclasses; kafka-python agrees,
# tests/unit/test_kafka_errors.py checks it): the one retriable table of the project
_RETRIABLE = frozenset(
    {
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.ELECTION_NOT_NEEDED,
        KafkaError.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.FETCH_SESSION_ID_NOT_FOUND,
        KafkaError.FETCH_SESSION_TOPIC_ID_ERROR,
        KafkaError.INCONSISTENT_TOPIC_ID,
        KafkaError.INVALID_FETCH_SESSION_EPOCH,
        KafkaError.INVALID_SHARE_SESSION_EPOCH,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.LISTENER_NOT_FOUND,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_CONTROLLER,
        KafkaError.NOT_COORDINATOR,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.NOT_LEADER_OR_FOLLOWER,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.PREFERRED_LEADER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.SHARE_SESSION_NOT_FOUND,
        KafkaError.THROTTLING_QUOTA_EXCEEDED,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_ID,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)


# --------------------------------------------------------------------------- exceptions


class KafkaProtocolError(Exception):
    """Base class of the errors raised while decoding/encoding Kafka wire-protocol frames."""


class MalformedRequestError(KafkaProtocolError):
    """The frame is not a valid request: truncated, wrong sizes, trailing bytes, bad UTF-8, ...

    ``api_key``/``api_version``/``correlation_id`` are filled when the fixed part of the
    header could be read (for logging), else None.
    """

    def __init__(
        self,
        message: str,
        *,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class UnknownApiKeyError(KafkaProtocolError):
    """The request's api key has no kafka-python schema, or this server does not serve it."""

    def __init__(
        self, api_key: int, api_version: int, correlation_id: int, reason: str = "unknown"
    ) -> None:
        super().__init__(
            f"{reason} api key {api_key} (version {api_version}, correlation id {correlation_id})"
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class UnsupportedVersionError(KafkaProtocolError):
    """A known api key with a version outside the range that can be decoded (or served).

    ``client_id`` is the header's client id when it could be read (else None).
    """

    def __init__(
        self, api_key: int, api_version: int, correlation_id: int, client_id: str | None = None
    ) -> None:
        super().__init__(
            f"unsupported version {api_version} of api key {api_key} (correlation id {correlation_id})"
        )
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id


class ResponseEncodingError(KafkaProtocolError):
    """A handler returned a response object that cannot be encoded for its request (a bug)."""


class InvalidRecordBatchError(KafkaProtocolError):
    """A record batch failed validation; ``error_code`` is what a Kafka broker would answer."""

    def __init__(self, error_code: KafkaError, message: str) -> None:
        super().__init__(f"{error_code.name}: {message}")
        self.error_code = error_code
        self.message = message
