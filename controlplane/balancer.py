"""Self-balancing of partition leadership (AutoMQ's auto-balancer), as pure decisions.

A move copies no data (see `placement.py`), so the balancer may move partitions freely; what
it must not do is move many at once (each move is a metadata burst: a partition record, a
stream close with an upload, an open) or move the same partitions back and forth. So:

- It runs on the controller leader, one **round** every `60 / max_rounds_per_minute` s, and a
  round moves at most `max_moves_per_round` partitions. No round starts while a move of the
  previous ones is still in progress: a move is in progress until the new leader has opened
  the stream at the new epoch (what `automqctl reassign verify` checks). A move unfinished
  after `stall_after_ms` makes the balancer `stalled` (it waits, so it never piles moves onto
  a broken broker); after `abandon_after_ms` it stops waiting for it.
- Its decisions are `plan_round(image, rates, now_ms, settings)`: a pure function of the
  metadata image and the produce rates brokers report with their heartbeats (bytes/s per
  stream). The moves go through the quorum as one `balance_partitions` command, which
  applies each only if the partition is still where the plan saw it (optimistic: a
  partition moved meanwhile is skipped, never moved twice).
- Goals, in order: (1) partition **count** per broker; (2) **throughput** per broker, when
  the cluster's known produce rate is at least `throughput_min_bytes_per_s` (below that,
  rates are noise and count alone decides). Only active brokers registered for at least
  `broker_settle_ms` take part (fenced, shutting-down and just-registered ones neither give
  nor take), and only partitions whose stream is open on their leader at the leader epoch
  and that are not in the last manual reassignment within `manual_hold_ms` (the operator's
  placement is respected) may move, at most once per round, and never back to a broker the
  balancer took them from within `partition_cooldown_ms`.
- **Hysteresis**: a goal starts moving only when a broker is outside a wide band (count:
  ±`count_tolerance` of the mean; throughput: ±`throughput_tolerance`); once it moved,
  rounds within `episode_ms` go on to a tight target (count: max - min <= 1; throughput:
  half the band). Every move strictly reduces the imbalance it fixes, so a balanced cluster
  is a fixed point: nothing moves, whatever the order of rounds.

State in the metadata (KV, so it survives a controller failover): `balancer/enabled`
("false" turns it off; absent means on) and `balancer/moves`, the last `MAX_HISTORY` moves
(time, partition, from, to, new epoch, reason) that `automqctl balancer status` shows and the
in-progress check reads.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from controlplane import records as r
from controlplane.image import MetadataImage
from controlplane.placement import move_record
from controlplane.reassignment import LAST_REASSIGNMENT_KEY
from controlplane.records import StreamState
from controlplane.requests import (
    BalanceMove,
    BalancePartitionsRequest,
    SetBalancerRequest,
)
from controlplane.settings import BalancerSettings

ENABLED_KEY = "balancer/enabled"
MOVES_KEY = "balancer/moves"
MAX_HISTORY = 32  # moves kept in the KV (each round rewrites it: keep it small)

STATE_OFF = "off"
STATE_IDLE = "idle"
STATE_IN_PROGRESS = "in_progress"
STATE_STALLED = "stalled"

MODE_COUNT = "count"
MODE_THROUGHPUT = "throughput"

MOVE_DONE = "done"
MOVE_IN_PROGRESS = "in_progress"
MOVE_SUPERSEDED = "superseded"  # the partition was moved again (or deleted) since


# ---------------------------------------------------------------- metadata state


def balancer_enabled(image: MetadataImage) -> bool:
    """On unless an operator turned it off (AutoMQ shipped it off; users thought it broken)."""
    return image.kv.get(ENABLED_KEY, "true") != "false"


@dataclass(frozen=True)
class RecordedMove:
    """One move as kept in `balancer/moves`."""

    time_ms: int
    topic_id: str
    topic: str
    partition: int
    from_node_id: int
    to_node_id: int
    epoch: int  # the leader epoch the move gave the partition
    reason: str

    def to_json(self) -> dict:
        return {
            "time_ms": self.time_ms,
            "topic_id": self.topic_id,
            "topic": self.topic,
            "partition": self.partition,
            "from": self.from_node_id,
            "to": self.to_node_id,
            "epoch": self.epoch,
            "reason": self.reason,
        }

    @staticmethod
    def from_json(d: dict) -> RecordedMove:
        return RecordedMove(
            int(d["time_ms"]),
            str(d["topic_id"]),
            str(d["topic"]),
            int(d["partition"]),
            int(d["from"]),
            int(d["to"]),
            int(d["epoch"]),
            str(d.get("reason", "")),
        )


def recent_moves(image: MetadataImage) -> list[RecordedMove]:
    """The recorded moves, oldest first ([] if none or unreadable)."""
    raw = image.kv.get(MOVES_KEY)
    if not raw:
        return []
    try:
        return [RecordedMove.from_json(d) for d in json.loads(raw)]
    except (ValueError, KeyError, TypeError):
        return []  # written by this module only; a bad value must not wedge the balancer


def stream_settled(image: MetadataImage, stream_id: int, node_id: int, epoch: int) -> bool:
    """The stream is open on `node_id` at `epoch`: that broker takes writes for it."""
    s = image.streams.get(stream_id)
    return (
        s is not None
        and s.state == StreamState.OPENED
        and s.node_id == node_id
        and s.epoch == epoch
    )


def move_status(image: MetadataImage, move: RecordedMove) -> str:
    """done / in_progress (new leader has not opened the stream yet) / superseded."""
    topic = image.topics.get(move.topic_id)
    p = topic.partitions.get(move.partition) if topic is not None else None
    if p is None or p.leader_epoch != move.epoch or p.leader_node_id != move.to_node_id:
        return MOVE_SUPERSEDED
    if stream_settled(image, p.stream_id, move.to_node_id, move.epoch):
        return MOVE_DONE
    return MOVE_IN_PROGRESS


def _manually_held(
    image: MetadataImage, now_ms: int, hold_ms: int
) -> tuple[set[tuple[str, int]], int | None]:
    """(topic name, partition) of the last `reassign` plan, if submitted within `hold_ms`,
    and when that hold ends (ms, controller clock); (empty, None) otherwise."""
    raw = image.kv.get(LAST_REASSIGNMENT_KEY)
    if not raw or hold_ms <= 0:
        return set(), None
    try:
        last = json.loads(raw)
        until_ms = int(last["started_ms"]) + hold_ms
        if now_ms > until_ms:
            return set(), None
        return {(str(m["topic"]), int(m["partition"])) for m in last["moves"]}, until_ms
    except (ValueError, KeyError, TypeError):
        return set(), None


# ---------------------------------------------------------------- planning (pure)


@dataclass
class BrokerLoad:
    """One broker as the planner sees it."""

    node_id: int
    az: str
    eligible: bool  # may give and take partitions now
    why_not: str  # why not eligible ("" if eligible)
    partitions: int = 0  # partitions it leads
    bytes_per_s: float = 0.0  # summed known produce rate of those

    def to_json(self) -> dict:
        return {
            "node_id": self.node_id,
            "az": self.az,
            "eligible": self.eligible,
            "why_not": self.why_not,
            "partitions": self.partitions,
            "bytes_per_s": round(self.bytes_per_s, 1),
        }


@dataclass
class BalancerDecision:
    """What a round decided (and what status shows)."""

    enabled: bool
    state: str  # off / idle / in_progress / stalled
    mode: str  # count / throughput
    detail: str  # why nothing moves, or what it does
    moves: list[BalanceMove] = field(default_factory=list)
    brokers: list[BrokerLoad] = field(default_factory=list)
    unfinished: list[RecordedMove] = field(default_factory=list)
    # the last `reassign` plan's partitions (topic, partition), left where the operator put
    # them until pinned_until_ms (manual_hold_ms after it was submitted)
    pinned: list[tuple[str, int]] = field(default_factory=list)
    pinned_until_ms: int | None = None


@dataclass
class _Partition:
    topic_id: str
    topic: str
    partition: int
    leader: int
    epoch: int
    rate: float
    movable: bool
    # brokers the balancer moved it away from lately: it does not go back there (anti-flap)
    no_return: frozenset[int] = frozenset()

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


def _broker_loads(
    image: MetadataImage, now_ms: int, settings: BalancerSettings
) -> dict[int, BrokerLoad]:
    loads: dict[int, BrokerLoad] = {}
    for b in sorted(image.brokers.values(), key=lambda b: b.node_id):
        if b.shutting_down:
            why = "shutting down"
        elif b.fenced:
            why = f"fenced ({b.fence_reason})"
        elif now_ms - b.registered_ms < settings.broker_settle_ms:
            why = "just registered"
        else:
            why = ""
        loads[b.node_id] = BrokerLoad(b.node_id, b.az, eligible=not why, why_not=why)
    return loads


def _partitions(
    image: MetadataImage,
    rates: Mapping[int, float],
    eligible: set[int],
    now_ms: int,
    settings: BalancerSettings,
    history: list[RecordedMove],
    held: set[tuple[str, int]],
) -> list[_Partition]:
    """Partitions led by eligible brokers, with their rate and whether they may move (not
    `held`, and open on their leader)."""
    left: dict[tuple[str, int], set[int]] = defaultdict(set)
    for m in history:
        if now_ms - m.time_ms < settings.partition_cooldown_ms:
            left[(m.topic_id, m.partition)].add(m.from_node_id)
    out: list[_Partition] = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for p in sorted(topic.partitions.values(), key=lambda p: p.partition):
            if p.erasure_coded or p.leader_node_id not in eligible:
                continue
            movable = (
                stream_settled(image, p.stream_id, p.leader_node_id, p.leader_epoch)
                and (topic.name, p.partition) not in held
            )
            out.append(
                _Partition(
                    topic.topic_id,
                    topic.name,
                    p.partition,
                    p.leader_node_id,
                    p.leader_epoch,
                    max(0.0, float(rates.get(p.stream_id, 0.0))),
                    movable,
                    frozenset(left.get((topic.topic_id, p.partition), ())),
                )
            )
    return out


class _Round:
    """Mutable working state of one round's planning: counts and loads after the moves
    chosen so far."""

    def __init__(self, brokers: list[BrokerLoad], parts: list[_Partition], budget: int):
        self.az = {b.node_id: b.az for b in brokers}
        self.nodes = sorted(self.az)
        self.count: Counter[int] = Counter({n: 0 for n in self.nodes})
        self.load: dict[int, float] = {n: 0.0 for n in self.nodes}
        self.topic_count: dict[int, Counter[str]] = defaultdict(Counter)
        self.movable: dict[int, list[_Partition]] = defaultdict(list)
        for p in parts:
            self.count[p.leader] += 1
            self.load[p.leader] += p.rate
            self.topic_count[p.leader][p.topic] += 1
            if p.movable:
                self.movable[p.leader].append(p)
        self.budget = budget
        self.moves: list[BalanceMove] = []

    def move(self, p: _Partition, dst: int, reason: str) -> None:
        src = p.leader
        self.moves.append(
            BalanceMove(
                topic_id=p.topic_id,
                topic=p.topic,
                partition=p.partition,
                from_node_id=src,
                to_node_id=dst,
                leader_epoch=p.epoch,
                reason=reason[:256],
            )
        )
        self.movable[src].remove(p)  # a partition moves at most once per round
        self.count[src] -= 1
        self.count[dst] += 1
        self.load[src] -= p.rate
        self.load[dst] += p.rate
        self.topic_count[src][p.topic] -= 1
        self.topic_count[dst][p.topic] += 1
        self.budget -= 1


def _balance_counts(rnd: _Round, lo: int, hi: int, exact: bool, mode: str) -> None:
    """Move partitions from the brokers with the most to those with the fewest.

    Stops when every broker is within [lo, hi] and, if `exact`, max - min <= 1. Each move
    goes from a broker with at least 2 more partitions than its target, so the sum of
    squared counts strictly falls: no cycles.
    """
    mean = sum(rnd.count.values()) / len(rnd.nodes)
    while rnd.budget > 0:
        dst = min(rnd.nodes, key=lambda n: (rnd.count[n], rnd.load[n], n))
        fewest = [n for n in rnd.nodes if rnd.count[n] == rnd.count[dst]]
        # a giver needs a movable partition that may go to one of the emptiest brokers
        givers = [
            n
            for n in rnd.nodes
            if rnd.count[n] - rnd.count[dst] > 1
            and any(f not in p.no_return for p in rnd.movable[n] for f in fewest)
        ]
        if not givers:
            return
        src = max(givers, key=lambda n: (rnd.count[n], rnd.load[n], -n))
        out_of_band = rnd.count[src] > hi or rnd.count[dst] < lo
        if not out_of_band and not exact:
            return
        # among equally empty targets prefer the giver's AZ (its clients' traffic stays local)
        dst = min(
            (n for n in fewest if any(n not in p.no_return for p in rnd.movable[src])),
            key=lambda n: (rnd.az[n] != rnd.az[src], rnd.load[n], n),
        )
        p = min(
            (p for p in rnd.movable[src] if dst not in p.no_return),
            key=lambda p, src=src, dst=dst: _count_move_key(rnd, p, src, dst, mode),
        )
        rnd.move(
            p,
            dst,
            f"count: broker {src} led {rnd.count[src]} partitions, broker {dst} "
            f"{rnd.count[dst]} (mean {mean:.1f})",
        )


def _count_move_key(rnd: _Round, p: _Partition, src: int, dst: int, mode: str) -> tuple:
    """Which partition the count goal moves first (smallest key)."""
    if mode == MODE_THROUGHPUT:
        # idle partitions first: the count goal must not undo the throughput goal
        return (p.rate, p.topic, p.partition)
    # keep topics spread: the topic the giver holds most of and the taker least of
    return (rnd.topic_count[dst][p.topic] - rnd.topic_count[src][p.topic], p.topic, p.partition)


def _balance_throughput(rnd: _Round, band: float, lo: int, hi: int) -> None:
    """Move partitions from the broker with the highest produce rate to the one with the
    lowest until both are within mean x (1 ± band).

    A move of rate r from load A to load B (A > B) is taken only if 0 < r < A - B, so the
    pair's maximum falls and their spread shrinks: no cycles. Count stays within [lo, hi].
    """
    total = sum(rnd.load.values())
    mean = total / len(rnd.nodes)
    min_rate = mean * 0.01  # moving crumbs costs a move and changes nothing
    while rnd.budget > 0:
        hot = max(rnd.nodes, key=lambda n: (rnd.load[n], rnd.count[n], -n))
        cold = min(rnd.nodes, key=lambda n: (rnd.load[n], rnd.count[n], n))
        if rnd.load[hot] <= mean * (1 + band) and rnd.load[cold] >= mean * (1 - band):
            return
        gap = rnd.load[hot] - rnd.load[cold]
        if rnd.count[hot] - 1 < lo or rnd.count[cold] + 1 > hi:
            return
        candidates = [
            p for p in rnd.movable[hot] if min_rate <= p.rate < gap and cold not in p.no_return
        ]
        if not candidates:
            return
        p = min(candidates, key=lambda p: (abs(gap / 2 - p.rate), p.topic, p.partition))
        rnd.move(
            p,
            cold,
            f"throughput: broker {hot} {_rate_text(rnd.load[hot])}, broker "
            f"{cold} {_rate_text(rnd.load[cold])} (mean {_rate_text(mean)}); "
            f"moves {_rate_text(p.rate)}",
        )


def _rate_text(bytes_per_s: float) -> str:
    for unit, size in (("MiB/s", 1024 * 1024), ("KiB/s", 1024)):
        if bytes_per_s >= size:
            return f"{bytes_per_s / size:.1f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def plan_round(
    image: MetadataImage, rates: Mapping[int, float], now_ms: int, settings: BalancerSettings
) -> BalancerDecision:
    """One round's decision: the state, and the moves to submit now (possibly none).

    `rates` is the produce rate in bytes/s of the streams whose leader reported it lately
    (stream id -> rate); partitions without one count as idle. Pure: no I/O, no clock.
    """
    enabled = balancer_enabled(image)
    history = recent_moves(image)
    unfinished = [
        m
        for m in history
        if now_ms - m.time_ms < settings.abandon_after_ms
        and move_status(image, m) == MOVE_IN_PROGRESS
    ]
    stalled = [m for m in unfinished if now_ms - m.time_ms >= settings.stall_after_ms]
    state = (
        STATE_OFF
        if not enabled
        else STATE_STALLED
        if stalled
        else STATE_IN_PROGRESS
        if unfinished
        else STATE_IDLE
    )

    loads = _broker_loads(image, now_ms, settings)
    eligible = {n for n, b in loads.items() if b.eligible}
    held, held_until_ms = _manually_held(image, now_ms, settings.manual_hold_ms)
    parts = _partitions(image, rates, eligible, now_ms, settings, history, held)
    for p in parts:
        loads[p.leader].partitions += 1
        loads[p.leader].bytes_per_s += p.rate
    total_rate = sum(p.rate for p in parts)
    mode = (
        MODE_THROUGHPUT
        if total_rate >= max(settings.throughput_min_bytes_per_s, 1e-9)
        else MODE_COUNT
    )
    decision = BalancerDecision(
        enabled,
        state,
        mode,
        "",
        brokers=list(loads.values()),
        unfinished=unfinished,
        pinned=sorted(held),
        pinned_until_ms=held_until_ms,
    )
    if not enabled:
        decision.detail = "disabled (automqctl balancer enable)"
        return decision
    if stalled:
        m = stalled[0]
        decision.detail = (
            f"waiting for {m.topic}-{m.partition} to open on broker "
            f"{m.to_node_id} (moved {(now_ms - m.time_ms) // 1000}s ago)"
        )
        return decision
    if unfinished:
        decision.detail = f"waiting for {len(unfinished)} move(s) to finish"
        return decision
    if len(eligible) < 2 or not parts:
        decision.detail = "balanced (fewer than 2 eligible brokers, or no partitions)"
        return decision

    brokers = [loads[n] for n in sorted(eligible)]
    rnd = _Round(brokers, parts, settings.max_moves_per_round)
    mean = len(parts) / len(brokers)
    # after a move, go on to the tight target for a while (the trigger band is wider)
    continuing = any(now_ms - m.time_ms <= settings.episode_ms for m in history)
    if mode == MODE_COUNT:
        lo = math.floor(mean * (1 - settings.count_tolerance))
        hi = math.ceil(mean * (1 + settings.count_tolerance))
        triggered = continuing or any(not lo <= rnd.count[n] <= hi for n in rnd.nodes)
        _balance_counts(rnd, lo, hi, exact=triggered, mode=mode)
    else:
        slack = max(1, math.ceil(mean * settings.throughput_count_slack))
        lo, hi = math.floor(mean) - slack, math.ceil(mean) + slack
        _balance_counts(rnd, lo, hi, exact=False, mode=mode)
        tol = settings.throughput_tolerance
        rate_mean = total_rate / len(brokers)
        triggered = continuing or any(
            not rate_mean * (1 - tol) <= rnd.load[n] <= rate_mean * (1 + tol) for n in rnd.nodes
        )
        if triggered:
            _balance_throughput(rnd, tol / 2, lo, hi)
    decision.moves = rnd.moves
    if rnd.moves:
        decision.detail = f"{len(rnd.moves)} move(s) by {mode}"
    elif _outside_band(rnd, mode, lo, hi, settings):
        decision.detail = _why_stuck(rnd, parts, mode, now_ms, held, held_until_ms)
    else:
        decision.detail = f"balanced by {mode}"
    return decision


def _outside_band(rnd: _Round, mode: str, lo: int, hi: int, settings: BalancerSettings) -> bool:
    """A broker's count (or, by throughput, its produce rate) is outside the band that
    starts moves: the cluster is not balanced."""
    if any(not lo <= rnd.count[n] <= hi for n in rnd.nodes):
        return True
    if mode != MODE_THROUGHPUT:
        return False
    mean = sum(rnd.load.values()) / len(rnd.nodes)
    tol = settings.throughput_tolerance
    return any(not mean * (1 - tol) <= rnd.load[n] <= mean * (1 + tol) for n in rnd.nodes)


def _why_stuck(
    rnd: _Round,
    parts: list[_Partition],
    mode: str,
    now_ms: int,
    held: set[tuple[str, int]],
    held_until_ms: int | None,
) -> str:
    """Why an unbalanced cluster gets no move: partitions pinned by the last reassignment,
    cooling down after a move, or not open on their leader yet."""
    counts = "/".join(str(rnd.count[n]) for n in rnd.nodes)
    nodes = ",".join(str(n) for n in rnd.nodes)
    text = f"not balanced by {mode} (brokers {nodes} lead {counts} partitions), no move allowed: "
    pinned = sum(1 for p in parts if p.key in held)
    if held_until_ms is not None and pinned:
        left_s = max(0, held_until_ms - now_ms) // 1000
        return text + (
            f"{pinned} partition(s) pinned by the last `reassign` for another "
            f"{left_s // 60}m{left_s % 60:02d}s (see pinned_partitions)"
        )
    return text + "partitions cooling down after a move, or not open on their leader yet"


# ---------------------------------------------------------------- commands (replicated)


def set_balancer(image: MetadataImage, req: SetBalancerRequest, now_ms: int):
    """Turn the balancer on or off; moves already submitted still finish."""
    if balancer_enabled(image) == req.enabled:
        return [], {"enabled": req.enabled, "changed": False}
    return (
        [r.KVRecord(key=ENABLED_KEY, value="true" if req.enabled else "false")],
        {"enabled": req.enabled, "changed": True},
    )


def balance_partitions(image: MetadataImage, req: BalancePartitionsRequest, now_ms: int):
    """Apply the leader's moves that still make sense on this image; skip the others.

    A move is skipped (not an error: the image may have changed since the leader planned)
    if the balancer was turned off, the partition is no longer led by `from_node_id` at
    `leader_epoch`, or either broker is no longer active.
    """
    if not balancer_enabled(image):
        return [], {
            "moved": 0,
            "skipped": [f"{m.topic}-{m.partition}" for m in req.moves],
            "reason": "balancer disabled",
        }
    recs: list = []
    done: list[RecordedMove] = []
    skipped: list[str] = []
    seen: set[tuple[str, int]] = set()
    for m in req.moves:
        topic = image.topics.get(m.topic_id)
        p = topic.partitions.get(m.partition) if topic is not None else None
        src, dst = image.brokers.get(m.from_node_id), image.brokers.get(m.to_node_id)
        if (
            p is None
            or (m.topic_id, m.partition) in seen
            or p.leader_node_id != m.from_node_id
            or p.leader_epoch != m.leader_epoch
            or src is None
            or not src.active
            or dst is None
            or not dst.active
            or m.to_node_id == m.from_node_id
        ):
            skipped.append(f"{m.topic}-{m.partition}")
            continue
        seen.add((m.topic_id, m.partition))
        recs.append(move_record(topic, p, m.to_node_id))
        done.append(
            RecordedMove(
                now_ms,
                m.topic_id,
                topic.name,
                m.partition,
                m.from_node_id,
                m.to_node_id,
                p.leader_epoch + 1,
                m.reason,
            )
        )
    if done:
        history = (recent_moves(image) + done)[-MAX_HISTORY:]
        recs.append(
            r.KVRecord(
                key=MOVES_KEY, value=json.dumps([m.to_json() for m in history], sort_keys=True)
            )
        )
    return recs, {"moved": len(done), "skipped": skipped}


# ---------------------------------------------------------------- status


def status_document(
    image: MetadataImage,
    rates: Mapping[int, float],
    now_ms: int,
    settings: BalancerSettings,
    rates_known: bool = True,
) -> dict:
    """What `automqctl balancer status` prints (JSON; see docs/operations.md)."""
    d = plan_round(image, rates, now_ms, settings)
    recent = []
    for m in reversed(recent_moves(image)):
        recent.append(
            {
                **m.to_json(),
                "status": move_status(image, m),
                "age_s": round(max(0, now_ms - m.time_ms) / 1000, 1),
            }
        )
    return {
        "enabled": d.enabled,
        "state": d.state,
        "mode": d.mode,
        "detail": d.detail,
        "rates_known": rates_known,
        "brokers": [b.to_json() for b in d.brokers],
        "next_moves": [m.model_dump() for m in d.moves] if d.state == STATE_IDLE else [],
        "pinned_partitions": [{"topic": t, "partition": p} for t, p in d.pinned],
        "pinned_until_ms": d.pinned_until_ms,
        "recent_moves": recent,
        "settings": {
            "max_moves_per_round": settings.max_moves_per_round,
            "max_rounds_per_minute": settings.max_rounds_per_minute,
            "throughput_min_bytes_per_s": settings.throughput_min_bytes_per_s,
        },
    }
