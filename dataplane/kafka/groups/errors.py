"""Kafka protocol error codes used by group coordination.

Plain integers (the wire values) so the state machine stays independent of any
client library; ``tests/unit/test_group_handlers.py`` checks them against
``kafka.errors``.
"""

from __future__ import annotations

NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
INVALID_COMMIT_OFFSET_SIZE = 28
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
MEMBER_ID_REQUIRED = 79
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82

#: name -> code, for logs and tests.
BY_NAME: dict[str, int] = {
    name: value
    for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, int)
}
