"""The broker's optional components: the zone router, erasure-coded partitions, retention,
the transaction coordinator, the shard store, WAL failovers and the coordinator slots.

Each is a `Component`: `start()`, `stop()` and `on_metadata(delta, image)` (called on the
metadata follower's thread with each applied batch's delta, or None after a snapshot). The
assembly starts each only when configured or needed, subscribes it to the metadata follower,
and stops them in reverse order. Parts with another shape get a `ComponentAdapter`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from controlplane.coordinators import group_slot, owned_slots
from controlplane.image import MetadataDelta, MetadataImage

log = logging.getLogger(__name__)


class Component(Protocol):
    """A part of the broker that is started, stopped and told about metadata changes."""

    name: str

    def start(self) -> None:
        """Start serving (threads, sockets, tasks)."""

    def stop(self) -> None:
        """Stop serving; never raises for a part that was not started."""

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """A new image (`delta` None: a snapshot, anything may have changed). Runs on the
        metadata follower's thread: hand slow work to the component's own thread."""


def _nothing() -> None:
    return None


@dataclass
class ComponentAdapter:
    """A `Component` made of a part's own start / stop / metadata calls."""

    name: str
    start_fn: Callable[[], None] = _nothing
    stop_fn: Callable[[], None] = _nothing
    metadata_fn: Callable[[MetadataDelta | None, MetadataImage], None] | None = None

    def start(self) -> None:
        """Start the part."""
        self.start_fn()

    def stop(self) -> None:
        """Stop the part."""
        self.stop_fn()

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """Hand the part the new image, if it follows metadata."""
        if self.metadata_fn is not None:
            self.metadata_fn(delta, image)


class CoordinatorSlots:
    """Unloads the groups of coordinator slots that moved away from this node.

    Runs on the metadata follower thread (the only user of `_owned`); group state lives on
    the Kafka event loop, so unloading is handed to it (`call_on_loop`)."""

    name = "coordinator-slots"

    def __init__(
        self,
        node_id: int,
        forget_offsets: Callable[[Callable[[str], bool]], None],
        unload_groups: Callable[[Callable[[str], bool]], None],
        call_on_loop: Callable[..., None],
    ):
        self.node_id = node_id
        self.forget_offsets = forget_offsets  # the offset store's cached offsets of groups
        self.unload_groups = unload_groups  # the group coordinator's state (event loop only)
        self.call_on_loop = call_on_loop
        self._owned: dict[int, int] = {}  # slot -> coordinator epoch, at the last image

    def start(self) -> None:
        """Nothing to start: it only follows metadata."""

    def stop(self) -> None:
        """Nothing to stop."""

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """Slots moved away (or away and back): drop those groups' state and cached
        offsets; groups of slots that stayed are untouched (no rebalance)."""
        now_owned = owned_slots(image, self.node_id)
        if now_owned == self._owned:
            return
        moved = frozenset(s for s, epoch in self._owned.items() if now_owned.get(s) != epoch)
        self._owned = now_owned
        if not moved:
            return
        count = image.coordinator_slot_count

        def in_moved(group: str) -> bool:
            return group_slot(group, count) in moved

        self.forget_offsets(in_moved)
        try:
            self.call_on_loop(self.unload_groups, in_moved)
        except (AttributeError, RuntimeError):  # the server is not running
            pass
        log.info(
            "coordinator slots %s moved away; node %d now owns %d slots",
            sorted(moved),
            self.node_id,
            len(now_owned),
        )
