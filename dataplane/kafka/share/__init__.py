"""KIP-932 share groups: queue semantics on Kafka partitions.

* :mod:`.protocol` - the ShareGroupHeartbeat/Describe, ShareFetch, ShareAcknowledge schemas;
* :mod:`.partition_state` - one share-partition's record states (pure);
* :mod:`.store` - its durable form in the controller KV, fenced by partition leadership;
* :mod:`.partitions` - the share-partitions this broker leads (load, persist, lock expiry);
* :mod:`.sessions` - share sessions;
* :mod:`.coordinator` - share-group membership at the group's coordinator;
* :mod:`.handlers`, :mod:`.describe`, :mod:`.offsets` - the Kafka APIs.

`build_share_apis` composes them for the broker.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.calls import ControllerCalls
from controlplane.share_state import share_state_key
from dataplane.config import ShareGroupsConfig
from dataplane.kafka.api_context import BrokerApiContext

from . import group_configs
from .coordinator import ShareGroupCoordinator
from .handlers import ShareApis
from .partitions import SharePartitions, ShareSettings
from .sessions import ShareSessions
from .store import ShareStateStore

__all__ = ["ShareApis", "ShareSettings", "build_share_apis", "share_settings"]


def build_share_apis(
    broker: BrokerApiContext,
    controller: ControllerCalls,
    node_epoch_fn: Callable[[], int],
    coordinates: Callable[[str], bool],
    config: ShareGroupsConfig,
    other_group_type: Callable[[str], str | None] = lambda group_id: None,
) -> ShareApis:
    """The share-group APIs of a broker (`coordinates(group)`: this broker is the group's
    coordinator and caught up with the metadata; `other_group_type(group)`: "classic" or
    "consumer" when a group of that type has the id)."""
    store = ShareStateStore(controller, broker.me.node_id, node_epoch_fn)
    defaults = share_settings(config)
    coordinator = ShareGroupCoordinator(
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        max_groups=config.max_groups,
        group_max_size=config.group_max_size,
        other_group_type=other_group_type,
    )
    return ShareApis(
        broker,
        coordinator,
        SharePartitions(
            store,
            lambda group_id: group_configs.settings_for(broker.image_fn(), group_id, defaults),
            broker.run_io,
            stored_value=lambda key: broker.image_fn().kv.get(share_state_key(*key)),
        ),
        ShareSessions(config.max_share_sessions),
        coordinates,
    )


def share_settings(config: ShareGroupsConfig) -> ShareSettings:
    """The share-partition settings of the broker config (groups' own configs go over)."""
    return ShareSettings(
        record_lock_duration_ms=config.record_lock_duration_ms,
        delivery_count_limit=config.delivery_count_limit,
        max_record_locks=config.partition_max_record_locks,
        auto_offset_reset=config.auto_offset_reset,
    )
