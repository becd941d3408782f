"""The compaction planner (pure: a metadata image and object indexes in, a plan out).

One run of the job rewrites a bounded set of committed objects and commits the result in
ONE controller command (atomic: the new objects appear and the old ones are marked
destroyed together, or nothing changes):

* **Stream-set object compaction** — the oldest stream-set objects (at most
  `max_objects_per_run`, at most `max_run_bytes` of sources) are merged: each stream's data
  from them becomes a stream object when it reaches `stream_split_bytes` (AutoMQ: 8 MiB),
  the rest is merged into one new stream-set object.
* **Stream-object merging** — adjacent small stream objects of one stream (contiguous
  offsets) merge into one, up to `stream_object_max_bytes`.
* **Cleanup** — data of deleted streams and offsets below a stream's start are dropped
  while rewriting; objects holding nothing live are only marked destroyed.

A stream-set object holds one contiguous run per stream (the object writer's rule), so a
stream whose data in the sources has a gap (a stream object in between) gets its further
runs as stream objects. The executor reads the planned blocks with ranged GETs and drops
batches below `trim_offset`; the controller checks the result (`objects.check_compaction`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from controlplane.image import MetadataImage
from controlplane.records import ObjectState
from dataplane.formats.object_format import IndexEntry

MiB = 1024 * 1024


@dataclass(frozen=True)
class PlanConfig:
    """Limits of one run (defaults from AutoMQ's: split 8 MiB, at most 500 objects)."""

    stream_split_bytes: int = 8 * MiB
    max_objects_per_run: int = 500
    max_run_bytes: int = 1024 * MiB  # source bytes read by one run
    max_stream_set_object_bytes: int = 256 * MiB
    stream_object_max_bytes: int = 256 * MiB  # merged stream objects stop growing here
    min_stream_set_objects: int = 2  # fewer (and nothing to clean up): nothing to do
    # stream-set objects older than this are split whole into stream objects (AutoMQ: 120
    # min), so old data ends up per stream and is not rewritten with every new upload
    force_split_after_ms: int = 120 * 60 * 1000
    # streams whose data always leaves stream-set objects as stream objects: the partitions
    # of compacted topics, which the log cleaner (spark_jobs/compact_topics.py) rewrites
    # one stream object at a time
    split_stream_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class SourceObject:
    """A committed object the run reads from."""

    object_id: int
    bucket_id: int
    size_bytes: int


@dataclass
class Piece:
    """One contiguous run of one stream, read from blocks of one or more source objects."""

    stream_id: int
    trim_offset: int  # batches ending at or below it are dropped (the stream's start)
    # (source object id, block entry) in offset order
    blocks: list[tuple[int, IndexEntry]] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(e.size for _, e in self.blocks)

    @property
    def start_offset(self) -> int:
        return self.blocks[0][1].start_offset

    @property
    def end_offset(self) -> int:
        return self.blocks[-1][1].end_offset


@dataclass
class ObjectTask:
    """One new object to write: a stream-set object (several streams) or a stream object."""

    kind: str  # "sso" | "so"
    pieces: list[Piece]
    object_id: int = -1  # assigned once the driver prepared the ids

    @property
    def size_bytes(self) -> int:
        return sum(p.size_bytes for p in self.pieces)


@dataclass
class CompactionPlan:
    """What one run writes and which objects its commit replaces."""

    tasks: list[ObjectTask] = field(default_factory=list)
    compacted_object_ids: list[int] = field(default_factory=list)
    destroy_only_ids: list[int] = field(default_factory=list)  # nothing live: no rewrite
    sources: dict[int, SourceObject] = field(default_factory=dict)
    order_id: int = 0

    @property
    def empty(self) -> bool:
        return not self.compacted_object_ids

    @property
    def bytes_to_read(self) -> int:
        return sum(t.size_bytes for t in self.tasks)

    def summary(self) -> dict:
        return {
            "compacted_objects": len(self.compacted_object_ids),
            "destroyed_without_rewrite": len(self.destroy_only_ids),
            "new_stream_set_objects": sum(1 for t in self.tasks if t.kind == "sso"),
            "new_stream_objects": sum(1 for t in self.tasks if t.kind == "so"),
            "bytes_to_read": self.bytes_to_read,
        }


def committed_object_count(image: MetadataImage) -> int:
    """Objects readers may use (committed and indexed)."""
    return sum(
        1
        for oid in (*image.stream_set_objects, *image.stream_objects)
        if (m := image.objects.get(oid)) is not None and m.state == ObjectState.COMMITTED
    )


def paused_reason(image: MetadataImage) -> str | None:
    """Why compaction must not run now, or None.

    Bucket failover (#11): new objects go to another bucket and the main one is unhealthy;
    compaction never reads from or writes to an unhealthy bucket, so it waits for failback.
    """
    failover = image.bucket_failover
    if failover.in_failover:
        return (
            f"bucket failover in progress (active bucket {failover.active_bucket_id} "
            f"since {failover.since_ms} ms: {failover.reason or 'no reason recorded'})"
        )
    return None


def _live_end(image: MetadataImage, stream_id: int, end_offset: int) -> bool:
    stream = image.streams.get(stream_id)
    return stream is not None and end_offset > stream.start_offset


def select_sources(image: MetadataImage, config: PlanConfig) -> list[SourceObject]:
    """The objects whose indexes the planner needs (pure): the oldest stream-set objects,
    then the stream objects of streams with several small adjacent ones, within limits."""
    chosen: list[SourceObject] = []
    total = 0

    def committed(oid: int):
        meta = image.objects.get(oid)
        return meta if meta is not None and meta.state == ObjectState.COMMITTED else None

    ssos = sorted(image.stream_set_objects.values(), key=lambda s: (s.order_id, s.object_id))
    ssos = [s for s in ssos if committed(s.object_id) is not None]
    dead_or_partly = [
        s for s in ssos if any(not _live_end(image, r.stream_id, r.end_offset) for r in s.ranges)
    ]
    to_split = [s for s in ssos if any(r.stream_id in config.split_stream_ids for r in s.ranges)]
    if len(ssos) >= config.min_stream_set_objects or dead_or_partly or to_split:
        for sso in ssos:
            meta = committed(sso.object_id)
            if len(chosen) >= config.max_objects_per_run:
                break
            if chosen and total + meta.size_bytes > config.max_run_bytes:
                break
            chosen.append(SourceObject(sso.object_id, meta.bucket_id, meta.size_bytes))
            total += meta.size_bytes
    for group in _stream_object_groups(image, config):
        if len(chosen) + len(group) > config.max_objects_per_run:
            break
        size = sum(s.size_bytes for s in group)
        if chosen and total + size > config.max_run_bytes:
            break
        chosen += group
        total += size
    return chosen


def _stream_object_groups(image: MetadataImage, config: PlanConfig) -> list[list[SourceObject]]:
    """Per stream: dead stream objects alone, and runs of >= 2 adjacent small ones."""
    by_stream: dict[int, list] = defaultdict(list)
    for so in image.stream_objects.values():
        meta = image.objects.get(so.object_id)
        if meta is not None and meta.state == ObjectState.COMMITTED:
            by_stream[so.stream_id].append((so, meta))
    groups: list[list[SourceObject]] = []
    for stream_id in sorted(by_stream):
        items = sorted(by_stream[stream_id], key=lambda x: x[0].start_offset)
        run: list[SourceObject] = []
        run_bytes = 0
        prev_end = None
        for so, meta in items:
            src = SourceObject(so.object_id, meta.bucket_id, meta.size_bytes)
            if not _live_end(image, stream_id, so.end_offset):
                groups.append([src])  # nothing live: destroyed without a rewrite
                continue
            small = meta.size_bytes < config.stream_object_max_bytes // 2
            if (
                run
                and small
                and prev_end == so.start_offset
                and run_bytes + meta.size_bytes <= config.stream_object_max_bytes
            ):
                run.append(src)
                run_bytes += meta.size_bytes
            else:
                if len(run) >= 2:
                    groups.append(run)
                run, run_bytes = ([src], meta.size_bytes) if small else ([], 0)
            prev_end = so.end_offset
        if len(run) >= 2:
            groups.append(run)
    return groups


def build_plan(
    image: MetadataImage,
    sources: list[SourceObject],
    indexes: dict[int, list[IndexEntry]],
    config: PlanConfig,
    now_ms: int = 0,
) -> CompactionPlan:
    """The run's plan from the chosen sources and their parsed indexes (pure). `now_ms`:
    the wall clock, for the forced split of old stream-set objects (0: none is old)."""
    plan = CompactionPlan(sources={s.object_id: s for s in sources})
    sso_sources = [s for s in sources if s.object_id in image.stream_set_objects]
    so_sources = [s for s in sources if s.object_id in image.stream_objects]
    tasks = _stream_set_object_tasks(image, sso_sources, indexes, config, now_ms)
    tasks += _stream_object_tasks(image, so_sources, indexes, plan)

    # an SSO source with no live block at all is destroyed without a rewrite
    used = {oid for t in tasks for p in t.pieces for oid, _ in p.blocks}
    for src in sso_sources:
        if src.object_id in used:
            plan.compacted_object_ids.append(src.object_id)
        else:
            plan.destroy_only_ids.append(src.object_id)
    plan.compacted_object_ids = sorted(set(plan.compacted_object_ids) | set(plan.destroy_only_ids))
    plan.tasks = tasks
    orders = [image.stream_set_objects[s.object_id].order_id for s in sso_sources]
    plan.order_id = min(orders) if orders else 0
    return plan


def _stream_set_object_tasks(
    image: MetadataImage,
    sso_sources: list[SourceObject],
    indexes: dict[int, list[IndexEntry]],
    config: PlanConfig,
    now_ms: int,
) -> list[ObjectTask]:
    """The new objects of the stream-set object sources (pure): per stream, the live blocks
    of all sources in offset order; the new stream-set object first (if any), then the
    stream objects."""
    old_ids = {
        s.object_id
        for s in sso_sources
        if now_ms
        and now_ms - image.stream_set_objects[s.object_id].committed_ms
        >= config.force_split_after_ms
    }
    blocks_by_stream: dict[int, list[tuple[int, IndexEntry]]] = defaultdict(list)
    for src in sso_sources:
        for entry in indexes[src.object_id]:
            stream = image.streams.get(entry.stream_id)
            if stream is None or entry.end_offset <= stream.start_offset:
                continue  # a deleted stream, or trimmed offsets: dropped
            blocks_by_stream[entry.stream_id].append((src.object_id, entry))
    sso_pieces: list[Piece] = []
    so_tasks: list[ObjectTask] = []
    for stream_id in sorted(blocks_by_stream):
        trim = image.streams[stream_id].start_offset
        pieces: list[Piece] = []
        forced: list[Piece] = []  # from old objects: split into stream objects
        for oid, entry in sorted(blocks_by_stream[stream_id], key=lambda b: b[1].start_offset):
            group = forced if oid in old_ids else pieces
            if group and group[-1].end_offset == entry.start_offset:
                group[-1].blocks.append((oid, entry))
            else:
                group.append(Piece(stream_id, trim, [(oid, entry)]))
        so_tasks += [ObjectTask("so", [p]) for p in forced]
        if not pieces:
            continue
        first, rest = pieces[0], pieces[1:]
        if first.size_bytes >= config.stream_split_bytes or stream_id in config.split_stream_ids:
            so_tasks.append(ObjectTask("so", [first]))
        else:
            sso_pieces.append(first)
        so_tasks += [ObjectTask("so", [p]) for p in rest]  # one run per stream per SSO
    # one new stream-set object; what does not fit becomes stream objects
    shared: list[Piece] = []
    shared_bytes = 0
    for piece in sorted(sso_pieces, key=lambda p: p.size_bytes):
        if shared_bytes + piece.size_bytes <= config.max_stream_set_object_bytes:
            shared.append(piece)
            shared_bytes += piece.size_bytes
        else:
            so_tasks.append(ObjectTask("so", [piece]))
    tasks: list[ObjectTask] = []
    if shared:
        tasks.append(ObjectTask("sso", sorted(shared, key=lambda p: p.stream_id)))
    return tasks + so_tasks


def _stream_object_tasks(
    image: MetadataImage,
    so_sources: list[SourceObject],
    indexes: dict[int, list[IndexEntry]],
    plan: CompactionPlan,
) -> list[ObjectTask]:
    """The new objects of the stream object sources: each contiguous group of sources of
    one stream becomes one; the sources go into `plan.compacted_object_ids`, or into
    `plan.destroy_only_ids` when nothing of them is live."""
    tasks: list[ObjectTask] = []
    by_stream_so: dict[int, list[SourceObject]] = defaultdict(list)
    for src in so_sources:
        by_stream_so[image.stream_objects[src.object_id].stream_id].append(src)
    for stream_id in sorted(by_stream_so):
        stream = image.streams.get(stream_id)
        srcs = sorted(
            by_stream_so[stream_id], key=lambda s: image.stream_objects[s.object_id].start_offset
        )
        piece: Piece | None = None
        for src in srcs:
            so = image.stream_objects[src.object_id]
            if stream is None or so.end_offset <= stream.start_offset:
                plan.destroy_only_ids.append(src.object_id)
                continue
            live = [
                (src.object_id, e)
                for e in indexes[src.object_id]
                if e.stream_id == stream_id and e.end_offset > stream.start_offset
            ]
            if piece is not None and live and piece.end_offset == live[0][1].start_offset:
                piece.blocks += live
            else:
                if piece is not None:
                    tasks.append(ObjectTask("so", [piece]))
                piece = Piece(stream_id, stream.start_offset, live) if live else None
            plan.compacted_object_ids.append(src.object_id)
        if piece is not None:
            tasks.append(ObjectTask("so", [piece]))
    return tasks
