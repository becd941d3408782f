"""Kafka consumer-group coordination (classic protocol) and committed offsets.

* :mod:`.state` - pure group model;
* :mod:`.coordinator` - :class:`GroupCoordinator`, the asyncio state machine;
* :mod:`.offsets` - :class:`OffsetStore` protocol, :class:`InMemoryOffsetStore`,
  :class:`OffsetManager` (commit/fetch/delete rules);
* :mod:`.handlers` - :class:`GroupHandlers`, kafka-python requests in, responses out.
"""

from .coordinator import GroupCoordinator
from .offsets import (
    CommittedOffset,
    InMemoryOffsetStore,
    OffsetManager,
    OffsetStore,
    OffsetStoreError,
)
from .state import (
    GroupListing,
    GroupState,
    GroupSummary,
    JoinGroupParams,
    JoinGroupResult,
    LeaveGroupResult,
    SyncGroupResult,
)

__all__ = [
    "CommittedOffset",
    "GroupCoordinator",
    "GroupListing",
    "GroupState",
    "GroupSummary",
    "InMemoryOffsetStore",
    "JoinGroupParams",
    "JoinGroupResult",
    "LeaveGroupResult",
    "OffsetManager",
    "OffsetStore",
    "OffsetStoreError",
    "SyncGroupResult",
]
