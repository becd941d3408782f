"""Committed group offsets kept durably in the controller's replicated KV.

One KV entry per group (`group-offsets/<group>`: JSON of topic -> partition -> offset,
leader epoch, metadata, time). A group has one coordinator broker at a time — the owner of
the group's coordinator slot (`controlplane/coordinators.py`) — which keeps the group's
document in memory and writes it whole on each commit (one Raft commit per OffsetCommit,
atomic for all its partitions) with `put_group_offsets`, fenced by the slot's coordinator
epoch: once the slot moved, the old owner's writes are refused (NOT_COORDINATOR).

A coordinator that takes a slot over reads a group's document from the metadata image it
follows, at the latest when it first serves the group at the new epoch; every write the
controller accepted from an earlier owner precedes the slot move in the log, so that image
holds it. A cached document is reloaded whenever the slot's epoch differs from the one it
was loaded at. The document is bounded (`MAX_DOC_BYTES`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

from controlplane.calls import ControllerCalls, build_request
from controlplane.coordinators import GROUP_OFFSETS_KEY_PREFIX, slot_of
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.requests import PutGroupOffsetsRequest
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.offsets import CommittedOffset, GroupLocks, OffsetStoreError

KEY_PREFIX = GROUP_OFFSETS_KEY_PREFIX
MAX_DOC_BYTES = 900_000
# offsets committed inside a transaction (TxnOffsetCommit) wait in the group's document
# under this key (not a valid topic name) per producer id, until the transaction's marker
# makes them committed or drops them
PENDING_KEY = " txn"  # the controller's KV values are capped at 1 MB
# the state of a KIP-848 consumer group (`ConsumerGroupCoordinator`) lives in its document
# under this key (not a valid topic name either), written whole with each change
GROUP_STATE_KEY = " group"
PUT_TIMEOUT_S = 10.0

# the controller refused the write because this broker no longer coordinates the group
_NOT_COORDINATOR = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.NODE_FENCED,
    ErrorCode.STALE_NODE_EPOCH,
    ErrorCode.UNKNOWN_NODE,
}


class KVOffsetStore:
    """`OffsetStore` on the controller KV (see the module docstring).

    Thread-safety: the Kafka handlers call it on the event loop (controller calls run on the
    loop's default executor); `forget_groups` is called from the metadata follower thread.
    The document cache is guarded by a lock; the image is read, never changed.
    """

    def __init__(
        self,
        controller: ControllerCalls,
        image_fn: Callable[[], MetadataImage],
        node_id: int,
        node_epoch_fn: Callable[[], int],
    ):
        self.controller = controller
        self.image_fn = image_fn
        self.node_id = node_id
        self.node_epoch_fn = node_epoch_fn
        self._docs: dict[str, tuple[int, dict]] = {}  # group -> (coordinator epoch, doc)
        self._lock = threading.Lock()
        # one read-modify-write of a group's document at a time (event loop only)
        self._locks = GroupLocks()

    def _coordinator_epoch(self, group_id: str) -> int:
        """The epoch of the group's slot if this broker owns it (NOT_COORDINATOR if not)."""
        image = self.image_fn()
        slot = slot_of(image, group_id)
        state = image.coordinator_slots.get(slot) if slot is not None else None
        if state is None or state.node_id != self.node_id:
            raise OffsetStoreError(
                f"node {self.node_id} does not coordinate group {group_id!r}",
                error_code=KafkaError.NOT_COORDINATOR,
            )
        return state.epoch

    def _doc(self, group_id: str) -> tuple[int, dict]:
        """(coordinator epoch, document); (re)loaded from the image at a new epoch."""
        epoch = self._coordinator_epoch(group_id)
        with self._lock:
            cached = self._docs.get(group_id)
            if cached is not None and cached[0] == epoch:
                return cached
            raw = self.image_fn().kv.get(KEY_PREFIX + group_id)
            loaded = (epoch, json.loads(raw) if raw else {})
            self._docs[group_id] = loaded
            return loaded

    async def commit(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        async with self._locks.hold(group_id):
            await self._commit(group_id, offsets)

    async def _commit(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        epoch, current = self._doc(group_id)
        doc = json.loads(json.dumps(current))  # a copy: change only on success
        for (topic, partition), c in offsets.items():
            doc.setdefault(topic, {})[str(partition)] = [
                c.offset,
                c.leader_epoch,
                c.metadata,
                c.commit_timestamp_ms,
            ]
        text = json.dumps(doc, separators=(",", ":"))
        if len(text) > MAX_DOC_BYTES:
            raise OffsetStoreError(
                f"offsets of group {group_id} exceed {MAX_DOC_BYTES} bytes",
                error_code=KafkaError.OFFSET_METADATA_TOO_LARGE,
            )
        await self._put(group_id, epoch, text)
        with self._lock:
            cached = self._docs.get(group_id)
            if cached is None or cached[0] == epoch:
                self._docs[group_id] = (epoch, doc)

    async def _put(self, group_id: str, epoch: int, value: str | None) -> None:
        req = build_request(  # group ids come from clients
            PutGroupOffsetsRequest,
            node_id=self.node_id,
            node_epoch=self.node_epoch_fn(),
            group_id=group_id,
            coordinator_epoch=epoch,
            value=value,
        )
        try:
            await asyncio.get_running_loop().run_in_executor(
                None,
                lambda: self.controller.put_group_offsets(req, timeout_s=PUT_TIMEOUT_S),
            )
        except ControllerError as exc:
            if exc.code in _NOT_COORDINATOR:
                self.forget(group_id)
                raise OffsetStoreError(
                    f"storing offsets refused: {exc}", error_code=KafkaError.NOT_COORDINATOR
                ) from None
            raise OffsetStoreError(f"storing offsets failed: {exc}") from None

    async def fetch(
        self, group_id: str, partitions: list[tuple[str, int]] | None
    ) -> dict[tuple[str, int], CommittedOffset]:
        _, doc = self._doc(group_id)
        wanted = None if partitions is None else set(partitions)
        out: dict[tuple[str, int], CommittedOffset] = {}
        for topic, parts in doc.items():
            if topic in (PENDING_KEY, GROUP_STATE_KEY):
                continue
            for p, (offset, epoch, metadata, ts) in parts.items():
                key = (topic, int(p))
                if wanted is None or key in wanted:
                    out[key] = CommittedOffset(offset, epoch, metadata, ts)
        return out

    def load_group_state(self, group_id: str) -> dict | None:
        """The consumer group state stored in the group's document, or None
        (`ConsumerGroupStore`; NOT_COORDINATOR if this broker does not own the group)."""
        _, doc = self._doc(group_id)
        state = doc.get(GROUP_STATE_KEY)
        return state if isinstance(state, dict) else None

    async def save_group_state(self, group_id: str, snapshot: Callable[[], dict | None]) -> None:
        """Store ``snapshot()`` as the group's state (None removes it); the writes of one
        group's document are serialized, and the snapshot is taken once this write's turn
        comes, so the last write carries the latest state. Unchanged state is not written."""
        async with self._locks.hold(group_id):
            epoch, current = self._doc(group_id)
            state = snapshot()
            if current.get(GROUP_STATE_KEY) == state:
                return
            doc = json.loads(json.dumps(current))
            if state is None:
                doc.pop(GROUP_STATE_KEY, None)
            else:
                doc[GROUP_STATE_KEY] = state
            if not doc:
                await self._put(group_id, epoch, None)
                with self._lock:
                    self._docs.pop(group_id, None)
                return
            await self._store_doc(group_id, epoch, doc)

    async def commit_pending(
        self, group_id: str, producer_id: int, offsets: dict[tuple[str, int], CommittedOffset]
    ) -> None:
        """TxnOffsetCommit: store offsets of `producer_id`'s open transaction, durable but not
        visible to OffsetFetch until `complete_pending` commits them."""
        async with self._locks.hold(group_id):
            epoch, current = self._doc(group_id)
            doc = json.loads(json.dumps(current))
            pending = doc.setdefault(PENDING_KEY, {}).setdefault(str(producer_id), {})
            for (topic, partition), c in offsets.items():
                pending.setdefault(topic, {})[str(partition)] = [
                    c.offset,
                    c.leader_epoch,
                    c.metadata,
                    c.commit_timestamp_ms,
                ]
            await self._store_doc(group_id, epoch, doc)

    async def complete_pending(self, group_id: str, producer_id: int, commit: bool) -> bool:
        """A transaction marker: `producer_id`'s pending offsets become committed (or are
        dropped). False when there was nothing pending for it."""
        async with self._locks.hold(group_id):
            epoch, current = self._doc(group_id)
            if str(producer_id) not in current.get(PENDING_KEY, {}):
                return False
            doc = json.loads(json.dumps(current))
            pending = doc[PENDING_KEY].pop(str(producer_id))
            if not doc[PENDING_KEY]:
                del doc[PENDING_KEY]
            if commit:
                for topic, parts in pending.items():
                    doc.setdefault(topic, {}).update(parts)
            await self._store_doc(group_id, epoch, doc)
            return True

    def pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        """Partitions with offsets of an undecided transaction (KIP-447 require_stable)."""
        _, doc = self._doc(group_id)
        return {
            (topic, int(p))
            for parts_by_topic in doc.get(PENDING_KEY, {}).values()
            for topic, parts in parts_by_topic.items()
            for p in parts
        }

    def owns_slot(self, slot: int) -> bool:
        """This broker owns coordinator slot `slot` in its current image."""
        state = self.image_fn().coordinator_slots.get(slot)
        return state is not None and state.node_id == self.node_id

    def groups_with_pending(self, slot: int, producer_id: int) -> list[str]:
        """Groups of `slot` coordinated here with offsets pending for `producer_id`."""
        image = self.image_fn()
        names = {k[len(KEY_PREFIX) :] for k in image.kv if k.startswith(KEY_PREFIX)}
        with self._lock:
            names |= set(self._docs)
        out = []
        for group_id in sorted(names):
            if slot_of(image, group_id) != slot:
                continue
            try:
                _, doc = self._doc(group_id)
            except OffsetStoreError:
                continue
            if str(producer_id) in doc.get(PENDING_KEY, {}):
                out.append(group_id)
        return out

    async def _store_doc(self, group_id: str, epoch: int, doc: dict) -> None:
        text = json.dumps(doc, separators=(",", ":"))
        if len(text) > MAX_DOC_BYTES:
            raise OffsetStoreError(
                f"offsets of group {group_id} exceed {MAX_DOC_BYTES} bytes",
                error_code=KafkaError.OFFSET_METADATA_TOO_LARGE,
            )
        await self._put(group_id, epoch, text)
        with self._lock:
            cached = self._docs.get(group_id)
            if cached is None or cached[0] == epoch:
                self._docs[group_id] = (epoch, doc)

    async def delete_group(self, group_id: str) -> None:
        async with self._locks.hold(group_id):
            epoch, _ = self._doc(group_id)
            await self._put(group_id, epoch, None)
            with self._lock:
                self._docs.pop(group_id, None)

    async def delete_offsets(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        async with self._locks.hold(group_id):
            epoch, current = self._doc(group_id)
            doc = json.loads(json.dumps(current))  # a copy: change only on success
            for topic, partition in partitions:
                doc.get(topic, {}).pop(str(partition), None)
                if topic in doc and not doc[topic]:
                    del doc[topic]
            if doc == current:
                return
            await self._put(
                group_id, epoch, json.dumps(doc, separators=(",", ":")) if doc else None
            )
            with self._lock:
                cached = self._docs.get(group_id)
                if cached is None or cached[0] == epoch:
                    self._docs[group_id] = (epoch, doc)

    async def list_groups(self) -> list[str]:
        names = {k[len(KEY_PREFIX) :] for k in self.image_fn().kv if k.startswith(KEY_PREFIX)}
        with self._lock:
            names |= {g for g, (_, d) in self._docs.items() if d}
        return sorted(names)

    def forget_groups(self, predicate: Callable[[str], bool]) -> int:
        """Drop the cached documents of the groups `predicate` picks (their slot moved);
        returns how many were dropped."""
        with self._lock:
            dropped = [g for g in self._docs if predicate(g)]
            for g in dropped:
                del self._docs[g]
        return len(dropped)

    def forget(self, group_id: str) -> None:
        """Drop the cached document (this broker no longer coordinates the group)."""
        with self._lock:
            self._docs.pop(group_id, None)
