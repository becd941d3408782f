"""Controller settings that every voter must share (they steer replicated decisions)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_COORDINATOR_SLOTS = 1_000
# partitions one balancer command may move (the command's request model checks it too)
MAX_BALANCER_MOVES_PER_COMMAND = 100
# partitions of one topic: create_topic and create_partitions refuse more, and a broker's
# default for new topics (dataplane.config) is held to it
MAX_PARTITIONS_PER_TOPIC = 10_000


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


class BalancerSettings(BaseModel):
    """Limits and thresholds of the balancer (leader-side; defaults suit a local cluster)."""

    model_config = ConfigDict(extra="forbid")

    max_moves_per_round: int = Field(default=8, ge=1, le=MAX_BALANCER_MOVES_PER_COMMAND)
    max_rounds_per_minute: int = Field(default=20, ge=1, le=60)
    broker_settle_ms: int = Field(default=3_000, ge=0, le=600_000)
    # a new controller leader waits this long for heartbeats with rates before balancing,
    # else it would balance by count, then move back once rates arrive
    leader_warmup_ms: int = Field(default=5_000, ge=0, le=600_000)
    partition_cooldown_ms: int = Field(default=60_000, ge=0, le=3_600_000)
    manual_hold_ms: int = Field(default=600_000, ge=0, le=86_400_000)
    episode_ms: int = Field(default=30_000, ge=0, le=3_600_000)
    stall_after_ms: int = Field(default=30_000, ge=1_000, le=3_600_000)
    abandon_after_ms: int = Field(default=300_000, ge=1_000, le=86_400_000)
    # rate reports older than this are ignored (the broker stopped heartbeating)
    rate_max_age_ms: int = Field(default=10_000, ge=1_000, le=600_000)
    count_tolerance: float = Field(default=0.1, ge=0.0, le=1.0)
    throughput_min_bytes_per_s: float = Field(default=1024 * 1024, ge=0.0)
    throughput_tolerance: float = Field(default=0.2, gt=0.0, le=1.0)
    # in throughput mode a broker's count may differ from the mean by this fraction (at
    # least 1), so a hot partition can sit on a broker with fewer partitions
    throughput_count_slack: float = Field(default=0.5, ge=0.0, le=10.0)

    @property
    def round_interval_ms(self) -> int:
        return 60_000 // self.max_rounds_per_minute
