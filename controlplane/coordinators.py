"""Group coordinator slots, placed on brokers as Kafka places `__consumer_offsets` partitions.

A fixed number of slots (`ControllerSettings.coordinator_slots`, default 50, fixed in the
metadata by the first placement) is assigned to brokers in the metadata log
(`CoordinatorSlotsRecord`). A group belongs to slot `abs(java hashCode(group_id)) % slots`
(Kafka's `Utils.abs(groupId.hashCode) % offsets.topic.num.partitions`), so the group's
coordinator is the slot's owner on every broker's image, and it changes only when that
slot moves:

* a slot moves away from its broker only when the broker is fenced for good (session
  expired, requested fence), starts a controlled shutdown or is unregistered — in the same
  command that fences it or evacuates its partitions. A broker that merely re-registered
  (restarted within its session) keeps its slots;
* unassigned slots (the first broker, or slots of a broker that left while no other broker
  was active) go to the least-loaded active broker;
* when a new or returning broker becomes active, only as many slots move to it as are
  needed to even the counts (max - min <= 1), ties broken towards the less loaded AZ.

`plan_slot_moves` is pure and deterministic; the state machine runs it after every command
that changed a broker (and on the leader's lifecycle tick). Each move bumps the slot's
epoch (Kafka's coordinator epoch): `put_group_offsets` accepts a group's offsets only from
the slot's current owner at that epoch, so a coordinator that lost the slot (paused, or not
yet aware) can no longer overwrite what the new one committed.

No I/O here.
"""

from __future__ import annotations

from collections import Counter

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import REGISTERED_REASON, require_active_broker
from controlplane.image import BrokerState, MetadataImage
from controlplane.requests import PutGroupOffsetsRequest, PutTxnStateRequest

#: KV key prefix of the committed-offsets document of a group (`<prefix><group id>`)
GROUP_OFFSETS_KEY_PREFIX = "group-offsets/"
#: KV key prefix of a transactional id's state document (`<prefix><transactional id>`)
TXN_STATE_KEY_PREFIX = "txn-state/"

#: record types that change which brokers may own slots
BROKER_RECORD_TYPES = frozenset(
    {
        "register_broker",
        "fence_broker",
        "unfence_broker",
        "broker_shutting_down",
        "unregister_broker",
    }
)


# ---------------------------------------------------------------- group -> slot -> broker


def java_string_hash(text: str) -> int:
    """Java's `String.hashCode` (signed 32-bit, over UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def group_slot(group_id: str, slot_count: int) -> int:
    """Kafka's partition of `__consumer_offsets` for a group: `Utils.abs(hashCode) % n`
    (`Utils.abs(Integer.MIN_VALUE)` is 0)."""
    if slot_count <= 0:
        raise ValueError("slot_count must be positive")
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % slot_count


def slot_of(image: MetadataImage, group_id: str) -> int | None:
    """The group's slot, or None while no slots are placed."""
    if image.coordinator_slot_count <= 0:
        return None
    return group_slot(group_id, image.coordinator_slot_count)


def group_coordinator(image: MetadataImage, group_id: str) -> int | None:
    """The broker coordinating `group_id`: its slot's owner if that broker is registered and
    unfenced; None (COORDINATOR_NOT_AVAILABLE, retriable) while the slot is unassigned or
    its owner is fenced and the slot has not moved yet."""
    slot = slot_of(image, group_id)
    state = image.coordinator_slots.get(slot) if slot is not None else None
    if state is None:
        return None
    broker = image.brokers.get(state.node_id)
    if broker is None or broker.fenced:
        return None
    return broker.node_id


def owned_slots(image: MetadataImage, node_id: int) -> dict[int, int]:
    """slot -> coordinator epoch of every slot `node_id` owns."""
    return {slot: s.epoch for slot, s in image.coordinator_slots.items() if s.node_id == node_id}


def slot_counts(image: MetadataImage) -> Counter[int]:
    """Slots owned per broker (every registered broker appears, possibly with 0)."""
    counts: Counter[int] = Counter({node: 0 for node in image.brokers})
    for s in image.coordinator_slots.values():
        counts[s.node_id] += 1
    return counts


# ---------------------------------------------------------------- placement (pure)


def _keeps_slots(broker: BrokerState | None) -> bool:
    """May keep the slots it owns: registered, not fenced for good, not shutting down. A
    broker waiting for its first heartbeat after a restart keeps them (moving them away and
    back would make their groups rebalance twice)."""
    if broker is None or broker.shutting_down:
        return False
    return not broker.fenced or broker.fence_reason == REGISTERED_REASON


def changes_brokers(recs: list) -> bool:
    """Some record changes whether a broker may own slots."""
    return any(getattr(rec, "type", None) in BROKER_RECORD_TYPES for rec in recs)


def plan_slot_moves(
    image: MetadataImage, default_slot_count: int
) -> list[r.CoordinatorSlotsRecord]:
    """The slot moves the image calls for: [] or one record (see the module docstring).

    Deterministic for one image; moves the fewest slots that place every slot on a broker
    that may keep it and even the active brokers' counts to within one.
    """
    count = image.coordinator_slot_count or default_slot_count
    receivers = sorted(b.node_id for b in image.brokers.values() if b.active)
    if not receivers or count <= 0:
        return []
    az = {n: image.brokers[n].az for n in receivers}
    load: Counter[int] = Counter({n: 0 for n in receivers})
    az_load: Counter[str] = Counter()
    owner: dict[int, int] = {}
    orphans: set[int] = set()
    for slot in range(count):
        state = image.coordinator_slots.get(slot)
        if state is not None and _keeps_slots(image.brokers.get(state.node_id)):
            owner[slot] = state.node_id
            if state.node_id in load:
                load[state.node_id] += 1
                az_load[az[state.node_id]] += 1
        else:
            orphans.add(slot)

    def least() -> int:
        return min(receivers, key=lambda n: (load[n], az_load[az[n]], n))

    def assign(slot: int, node: int) -> None:
        previous = owner.get(slot)
        if previous in load:
            load[previous] -= 1
            az_load[az[previous]] -= 1
        owner[slot] = node
        load[node] += 1
        az_load[az[node]] += 1

    for slot in sorted(orphans):
        assign(slot, least())
    for _ in range(count):  # bounded: every move narrows the spread
        most = max(receivers, key=lambda n: (load[n], az_load[az[n]], n))
        fewest = least()
        if load[most] - load[fewest] <= 1:
            break
        assign(max(s for s, n in owner.items() if n == most), fewest)

    assignments = []
    for slot in range(count):
        state = image.coordinator_slots.get(slot)
        if state is not None and state.node_id == owner[slot] and slot not in orphans:
            continue
        epoch = state.epoch + 1 if state is not None else 0
        assignments.append(r.CoordinatorSlotAssignment(slot=slot, node_id=owner[slot], epoch=epoch))
    if not assignments:
        return []
    return [r.CoordinatorSlotsRecord(slot_count=count, assignments=tuple(assignments))]


# ---------------------------------------------------------------- offsets (command)


def put_group_offsets(image: MetadataImage, req: PutGroupOffsetsRequest, now_ms: int):
    """Store (or delete) a group's committed-offsets document: only the current owner of
    the group's slot, at the slot's current epoch, may (NOT_COORDINATOR otherwise)."""
    require_active_broker(image, req.node_id, req.node_epoch)
    slot = slot_of(image, req.group_id)
    state = image.coordinator_slots.get(slot) if slot is not None else None
    if state is None or state.node_id != req.node_id or state.epoch != req.coordinator_epoch:
        current = "unassigned" if state is None else f"node {state.node_id} epoch {state.epoch}"
        raise ControllerError(
            ErrorCode.NOT_COORDINATOR,
            f"node {req.node_id} at coordinator epoch {req.coordinator_epoch} "
            f"does not coordinate group {req.group_id!r} (slot {slot}: "
            f"{current})",
        )
    return (
        [r.KVRecord(key=GROUP_OFFSETS_KEY_PREFIX + req.group_id, value=req.value)],
        {"slot": slot, "coordinator_epoch": state.epoch},
    )


# ---------------------------------------------------------------- transactions


def txn_coordinator(image: MetadataImage, transactional_id: str) -> int | None:
    """The broker coordinating `transactional_id`. Transaction coordinators use the same
    slots as group coordinators (Kafka's `__transaction_state` has 50 partitions placed like
    `__consumer_offsets`, with the same hash), so one slot move moves both."""
    return group_coordinator(image, transactional_id)


def _require_slot_owner(image: MetadataImage, key: str, node_id: int, epoch: int, what: str):
    slot = slot_of(image, key)
    state = image.coordinator_slots.get(slot) if slot is not None else None
    if state is None or state.node_id != node_id or state.epoch != epoch:
        current = "unassigned" if state is None else f"node {state.node_id} epoch {state.epoch}"
        raise ControllerError(
            ErrorCode.NOT_COORDINATOR,
            f"node {node_id} at coordinator epoch {epoch} does not coordinate {what} "
            f"{key!r} (slot {slot}: {current})",
        )
    return slot, state


def put_txn_state(image: MetadataImage, req: PutTxnStateRequest, now_ms: int):
    """Store (or delete) a transactional id's state: only the current owner of the id's
    slot, at the slot's current epoch, may (NOT_COORDINATOR otherwise), so a coordinator
    that lost the slot cannot overwrite what its successor decided."""
    require_active_broker(image, req.node_id, req.node_epoch)
    slot, state = _require_slot_owner(
        image, req.transactional_id, req.node_id, req.coordinator_epoch, "transactional id"
    )
    return (
        [r.KVRecord(key=TXN_STATE_KEY_PREFIX + req.transactional_id, value=req.value)],
        {"slot": slot, "coordinator_epoch": state.epoch},
    )
