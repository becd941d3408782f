"""The transaction coordinator of one broker (Kafka's `TransactionCoordinator`).

A transactional id belongs to a coordinator slot (`controlplane/coordinators.py`: the
same slots, hash and count as groups, as Kafka's `__transaction_state` mirrors
`__consumer_offsets`); the slot's owner coordinates it. Its metadata (`state.TxnMetadata`)
lives durably in the controller's KV (`txn-state/<id>`), written whole on every transition
with `put_txn_state`, fenced by the slot's coordinator epoch: once the slot moved, the old
owner can no longer write. A transition is stored before it takes effect, and EndTxn
answers once its PREPARE state is stored (the decision is then durable).

Markers: after PREPARE_COMMIT/ABORT, a COMMIT/ABORT control batch is written into every
partition of the transaction (locally when this broker leads it, else with WriteTxnMarkers
to its leader) and the group coordinators of the transaction's groups make its pending
offsets committed (or drop them); then COMPLETE is stored. What fails is retried by the
background tick, which also aborts ONGOING transactions past their timeout (epoch bumped,
which fences the old producer) and, when a slot moved here (a broker died or left), loads
its transactional ids from the KV and finishes their PREPARE states.

Thread-safety: every coroutine runs on the Kafka event loop; one transactional id's
operations are serialized by its asyncio lock; blocking calls (controller, other brokers)
run on the loop's default executor.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from controlplane.calls import ControllerCalls, build_request
from controlplane.coordinators import TXN_STATE_KEY_PREFIX, group_coordinator, slot_of
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.requests import PutTxnStateRequest
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.partition_backend import PartitionResolver
from dataplane.kafka.txn import state as st
from dataplane.kafka.txn.marker_client import CONSUMER_OFFSETS_TOPIC, send_write_txn_markers
from dataplane.runtime import outcome_within

log = logging.getLogger(__name__)

PUT_TIMEOUT_S = 10.0
MAX_TRANSACTIONAL_ID_CHARS = 1024  # the KV key's bound (PutTxnStateRequest)
MARKER_TIMEOUT_S = 10.0
TICK_INTERVAL_S = 1.0
# marker outcomes after which a partition needs no (more) marker: written, a newer epoch is
# already there, or the partition is gone
_MARKER_DONE = {
    KafkaError.NONE,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
}
_LOST_SLOT = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.NODE_FENCED,
    ErrorCode.STALE_NODE_EPOCH,
    ErrorCode.UNKNOWN_NODE,
}

#: (slot, producer id, commit) -> done: this broker's group coordinator applies a marker
GroupMarkerFn = Callable[[int, int, bool], Awaitable[bool]]
#: blocking: (host, port, pid, epoch, commit, coordinator epoch, partitions, timeout_s)
SendMarkersFn = Callable[..., dict[tuple[str, int], int]]


class NotCoordinator(Exception):
    """This broker does not coordinate the transactional id (or has not loaded it yet)."""

    def __init__(self, error: int):
        super().__init__(error)
        self.error = error


def _wall_ms() -> int:
    return int(time.time() * 1000)


class TransactionCoordinator:
    """Transactional ids of the slots this broker owns (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        controller: ControllerCalls,
        node_epoch_fn: Callable[[], int],
        next_producer_id: Callable[[], int],
        partitions: PartitionResolver,
        group_markers: GroupMarkerFn,
        *,
        ready_fn: Callable[[], bool] = lambda: True,
        send_markers: SendMarkersFn = send_write_txn_markers,
        clock_ms: Callable[[], int] = _wall_ms,
        max_timeout_ms: int = st.MAX_TXN_TIMEOUT_MS,
    ):
        self.node_id = node_id
        self.image_fn = image_fn
        self.controller = controller
        self.node_epoch_fn = node_epoch_fn
        self.next_producer_id = next_producer_id  # blocking (a controller call now and then)
        self.partitions = partitions
        self.group_markers = group_markers
        self.ready_fn = ready_fn  # False while the metadata image is mid-replay
        self.send_markers = send_markers
        self.clock_ms = clock_ms
        self.max_timeout_ms = max_timeout_ms
        self._txns: dict[str, tuple[int, st.TxnMetadata]] = {}  # id -> (slot epoch, meta)
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------ ownership, loading

    def _slot_epoch(self, image: MetadataImage, txn_id: str) -> int | None:
        slot = slot_of(image, txn_id)
        state = image.coordinator_slots.get(slot) if slot is not None else None
        if state is None or state.node_id != self.node_id:
            return None
        return state.epoch

    def coordinates(self, txn_id: str) -> bool:
        return self._slot_epoch(self.image_fn(), txn_id) is not None

    @staticmethod
    def _invalid_id(txn_id: str | None) -> bool:
        return not txn_id or len(txn_id) > MAX_TRANSACTIONAL_ID_CHARS

    def _lock(self, txn_id: str) -> asyncio.Lock:
        lock = self._locks.get(txn_id)
        if lock is None:
            lock = self._locks[txn_id] = asyncio.Lock()
        return lock

    def _load(self, txn_id: str) -> tuple[int, st.TxnMetadata | None]:
        """(slot epoch, metadata or None); loaded from the image at a new slot epoch.
        NotCoordinator when the slot is not ours (or the image is mid-replay)."""
        image = self.image_fn()
        epoch = self._slot_epoch(image, txn_id)
        if epoch is None:
            raise NotCoordinator(KafkaError.NOT_COORDINATOR)
        if not self.ready_fn():
            raise NotCoordinator(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
        cached = self._txns.get(txn_id)
        if cached is not None and cached[0] == epoch:
            return cached
        raw = image.kv.get(TXN_STATE_KEY_PREFIX + txn_id)
        meta = st.TxnMetadata.from_json(txn_id, raw) if raw else None
        if meta is not None:
            self._txns[txn_id] = (epoch, meta)
        return epoch, meta

    async def _store(self, epoch: int, meta: st.TxnMetadata) -> int:
        """Write `meta` durably (then it is current); a Kafka error code."""
        try:
            req = build_request(
                PutTxnStateRequest,
                node_id=self.node_id,
                node_epoch=self.node_epoch_fn(),
                transactional_id=meta.transactional_id,
                coordinator_epoch=epoch,
                value=meta.to_json(),
            )
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.controller.put_txn_state(req, timeout_s=PUT_TIMEOUT_S)
            )
        except ControllerError as exc:
            if exc.code in _LOST_SLOT:
                self._txns.pop(meta.transactional_id, None)
                return KafkaError.NOT_COORDINATOR
            log.warning("storing txn state of %r failed: %s", meta.transactional_id, exc)
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        self._txns[meta.transactional_id] = (epoch, meta)
        return KafkaError.NONE

    # ------------------------------------------------------------ requests

    async def init_producer_id(
        self, txn_id: str, timeout_ms: int, expected: tuple[int, int] = (-1, -1)
    ) -> tuple[int, int, int]:
        """InitProducerId: (error, producer id, epoch)."""
        if self._invalid_id(txn_id):
            return KafkaError.INVALID_REQUEST, -1, -1
        if st.validate_timeout(timeout_ms, self.max_timeout_ms):
            return KafkaError.INVALID_TRANSACTION_TIMEOUT, -1, -1
        async with self._lock(txn_id):
            try:
                epoch, meta = self._load(txn_id)
            except NotCoordinator as exc:
                return exc.error, -1, -1
            if meta is not None and meta.state == st.TxnState.ONGOING:
                # a new instance: abort what the old one left open (fencing it), then go on
                error = await self._abort(epoch, meta, bump_epoch=True)
                if error:
                    return error, -1, -1
                epoch, meta = self._load(txn_id)
            if meta is not None and meta.state.preparing:
                if not await self._finish(epoch, meta):
                    return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
                epoch, meta = self._load(txn_id)
            new_pid = -1
            if meta is None or meta.producer_epoch + 1 >= st.MAX_PRODUCER_EPOCH:
                try:
                    new_pid = await asyncio.get_running_loop().run_in_executor(
                        None, self.next_producer_id
                    )
                except ControllerError as exc:
                    log.warning("producer id allocation failed: %s", exc)
                    return KafkaError.COORDINATOR_NOT_AVAILABLE, -1, -1
            t = st.init_producer(meta, txn_id, timeout_ms, new_pid, self.clock_ms(), expected)
            if t.error:
                return t.error, -1, -1
            assert t.new is not None
            error = await self._store(epoch, t.new)
            if error:
                return error, -1, -1
            return KafkaError.NONE, t.new.producer_id, t.new.producer_epoch

    async def add_partitions(
        self, txn_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """AddPartitionsToTxn: an error per partition (unknown ones UNKNOWN_TOPIC_OR_PARTITION,
        the rest then OPERATION_NOT_ATTEMPTED, as Kafka)."""
        image = self.image_fn()
        unknown = set()
        for topic, p in partitions:
            t = image.topic_by_name(topic)
            if t is None or p not in t.partitions:
                unknown.add((topic, p))
        if unknown:
            return {
                tp: KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown
                else KafkaError.OPERATION_NOT_ATTEMPTED
                for tp in partitions
            }
        error = await self._add(txn_id, producer_id, producer_epoch, frozenset(partitions))
        return {tp: error for tp in partitions}

    async def add_offsets(
        self, txn_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> int:
        """AddOffsetsToTxn: the group's coordinator gets this transaction's marker."""
        return await self._add(
            txn_id, producer_id, producer_epoch, frozenset(), frozenset([group_id])
        )

    async def _add(
        self,
        txn_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: frozenset[tuple[str, int]],
        groups: frozenset[str] = frozenset(),
    ) -> int:
        if self._invalid_id(txn_id):
            return KafkaError.INVALID_REQUEST
        async with self._lock(txn_id):
            try:
                epoch, meta = self._load(txn_id)
            except NotCoordinator as exc:
                return exc.error
            t = st.add_to_txn(
                meta, producer_id, producer_epoch, self.clock_ms(), partitions, groups
            )
            if t.error or t.new is None:
                return t.error
            return await self._store(epoch, t.new)

    async def end_txn(
        self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> int:
        """EndTxn: store the decision, then write the markers (retried by the tick if they
        cannot all be written now: the decision is durable either way)."""
        if self._invalid_id(txn_id):
            return KafkaError.INVALID_REQUEST
        async with self._lock(txn_id):
            try:
                epoch, meta = self._load(txn_id)
            except NotCoordinator as exc:
                return exc.error
            t = st.end_txn(meta, producer_id, producer_epoch, commit, self.clock_ms())
            if t.error or t.new is None:
                return t.error
            error = await self._store(epoch, t.new)
            if error:
                return error
            await self._finish(epoch, t.new)
            return KafkaError.NONE

    # ------------------------------------------------------------ completion

    async def _abort(self, epoch: int, meta: st.TxnMetadata, bump_epoch: bool) -> int:
        prepared = st.begin_abort(meta, self.clock_ms(), bump_epoch)
        error = await self._store(epoch, prepared)
        if error:
            return error
        if not await self._finish(epoch, prepared):
            return KafkaError.CONCURRENT_TRANSACTIONS
        return KafkaError.NONE

    async def _finish(self, epoch: int, meta: st.TxnMetadata) -> bool:
        """Markers for a PREPARE state, then COMPLETE stored; False if not done yet."""
        try:
            done = await self._write_markers(epoch, meta)
        except Exception:
            log.exception("writing markers of %r failed", meta.transactional_id)
            done = False
        if not done:
            return False
        return await self._store(epoch, st.complete(meta, self.clock_ms())) == KafkaError.NONE

    async def _write_markers(self, coordinator_epoch: int, meta: st.TxnMetadata) -> bool:
        commit = meta.state == st.TxnState.PREPARE_COMMIT
        pid, pepoch = meta.producer_id, meta.producer_epoch
        image = self.image_fn()
        loop = asyncio.get_running_loop()
        remote: dict[int, list[tuple[str, int]]] = {}
        local_futures = []
        done = True
        for topic_name, p in sorted(meta.partitions):
            topic = image.topic_by_name(topic_name)
            if topic is None or p not in topic.partitions:
                continue  # deleted: no marker needed
            leader = topic.partitions[p].leader_node_id
            if leader != self.node_id:
                remote.setdefault(leader, []).append((topic_name, p))
                continue
            plog = self.partitions.get(topic.topic_id, p)
            if plog is None:
                done = False  # not open here yet: the tick retries
                continue
            error, fut = plog.write_marker(pid, pepoch, commit, coordinator_epoch)
            if fut is not None:
                local_futures.append(fut)
            elif error not in _MARKER_DONE:
                done = False
        local_slots: set[int] = set()
        for group_id in sorted(meta.groups):
            slot = slot_of(image, group_id)
            node = group_coordinator(image, group_id)
            if slot is None or node is None:
                done = False
            elif node == self.node_id:
                local_slots.add(slot)
            else:
                remote.setdefault(node, []).append((CONSUMER_OFFSETS_TOPIC, slot))
        for fut in local_futures:
            try:
                await outcome_within(fut, MARKER_TIMEOUT_S)
            except Exception as exc:
                log.warning("marker of %r not durable: %s", meta.transactional_id, exc)
                done = False
        for slot in sorted(local_slots):
            if not await self.group_markers(slot, pid, commit):
                done = False
        for node, parts in sorted(remote.items()):
            broker = image.brokers.get(node)
            if broker is None or broker.fenced:
                done = False
                continue
            try:
                results = await loop.run_in_executor(
                    None,
                    self.send_markers,
                    broker.host,
                    broker.kafka_port,
                    pid,
                    pepoch,
                    commit,
                    coordinator_epoch,
                    parts,
                    MARKER_TIMEOUT_S,
                )
            except Exception as exc:
                log.info("WriteTxnMarkers to node %d failed: %s", node, exc)
                done = False
                continue
            if any(
                results.get(tp, KafkaError.UNKNOWN_SERVER_ERROR) not in _MARKER_DONE for tp in parts
            ):
                done = False
        return done

    # ------------------------------------------------------------ background

    async def tick(self) -> None:
        """Load the transactional ids of slots that moved here, finish PREPARE states whose
        markers are missing, abort ONGOING transactions past their timeout."""
        if not self.ready_fn():
            return
        image = self.image_fn()
        for key in list(image.kv):
            if not key.startswith(TXN_STATE_KEY_PREFIX):
                continue
            txn_id = key[len(TXN_STATE_KEY_PREFIX) :]
            epoch = self._slot_epoch(image, txn_id)
            cached = self._txns.get(txn_id)
            if epoch is None:
                if cached is not None:
                    self._txns.pop(txn_id, None)  # the slot moved away
                continue
            if cached is None or cached[0] != epoch:
                try:
                    _, meta = self._load(txn_id)
                except (NotCoordinator, ValueError, KeyError) as exc:
                    log.warning("cannot load txn state of %r: %s", txn_id, exc)
                    continue
                if meta is not None and (meta.state.preparing or meta.state == st.TxnState.ONGOING):
                    log.info(
                        "took over %r at coordinator epoch %d: %s, producer %d epoch %d",
                        txn_id,
                        epoch,
                        meta.state.value,
                        meta.producer_id,
                        meta.producer_epoch,
                    )
        now = self.clock_ms()
        for txn_id, (_, meta) in list(self._txns.items()):
            if not (meta.state.preparing or meta.expired(now)):
                continue
            async with self._lock(txn_id):
                try:
                    epoch, meta = self._load(txn_id)
                except NotCoordinator:
                    continue
                if meta is None:
                    continue
                if meta.state.preparing:
                    if await self._finish(epoch, meta):
                        log.info("completed %s of %r", meta.state.value, txn_id)
                elif meta.expired(self.clock_ms()):
                    log.info("aborting %r: past its %d ms timeout", txn_id, meta.timeout_ms)
                    await self._abort(epoch, meta, bump_epoch=True)

    def start(self) -> None:
        """Run the tick every TICK_INTERVAL_S on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            try:
                await self.tick()
            except Exception:
                log.exception("transaction coordinator tick failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def snapshot(self) -> dict[str, st.TxnMetadata]:
        """The loaded metadata (tests, admin)."""
        return {txn_id: meta for txn_id, (_, meta) in self._txns.items()}
