"""Controller settings that every voter must share (they steer replicated decisions)."""

from __future__ import annotations

from pydantic import BaseModel, Field

MAX_COORDINATOR_SLOTS = 1_000


class ControllerSettings(BaseModel):
    """Deterministic settings of the metadata state machine."""

    bucket_ids: list[int] = Field(default_factory=lambda: [0])
    broker_session_timeout_ms: int = Field(default=6_000, ge=500, le=600_000)
    # MARK_DESTROYED objects are deleted from their bucket after this long (readers that
    # already located them can finish)
    object_destroy_retention_ms: int = Field(default=60_000, ge=0)
    # maximum records kept in memory for brokers that follow the log; older readers get a
    # snapshot of the image instead
    log_retention_records: int = Field(default=100_000, ge=100)
    # group coordinator slots (Kafka's offsets.topic.num.partitions): used when the slots
    # are first placed; the count in the metadata never changes afterwards (it would
    # remap every group)
    coordinator_slots: int = Field(default=50, ge=1, le=MAX_COORDINATOR_SLOTS)
