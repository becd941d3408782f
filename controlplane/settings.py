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
    # the zone router's route epoch is bumped this often by the leader (0: never)
    route_epoch_interval_ms: int = Field(default=10_000, ge=0, le=3_600_000)
    # object-storage failover: the leader switches new objects to the failover bucket when
    # a majority of live brokers report failed writes to the main bucket for this long
    bucket_failover_detect_ms: int = Field(default=10_000, ge=500, le=3_600_000)
    # back to the main bucket automatically once a majority reports it healthy this long;
    # 0 = only by hand (the default)
    bucket_failover_auto_return_ms: int = Field(default=0, ge=0, le=86_400_000)
