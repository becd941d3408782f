"""Compacted topics (`cleanup.policy=compact` / `compact,delete`): the log-cleaner stage of
the compaction job.

Runs after the object compaction of the same run (`spark_jobs.compact.run`), which moves
every partition of a compacted topic out of stream-set objects into stream objects
(`PlanConfig.split_stream_ids`). So the cleaner only ever rewrites **stream objects**: an
object of one stream, replaced 1:1 by an object holding the same offset range — no other
stream's data is touched, and no stream-set object shared with other streams is rewritten.

Which partitions a run cleans (`select_clean_tasks`, policy in `cleaner_policy`): the
partition's cleaner checkpoint (`cleaned_offset` in the metadata, recorded by the driver
after each run) splits its objects into clean and dirty ones; it is cleaned when the dirty
ratio is above `min.cleanable.dirty.ratio`, or some dirty data is older than
`max.compaction.lag.ms`.

One Spark task per partition (stream), `clean_stream`:

* the cleanable range is the stream's committed stream objects from its start, in offset
  order, while contiguous — only committed objects, never data still in a broker's WAL (the
  active head) — and up to the first dirty object holding a batch newer than
  `min.compaction.lag.ms`;
* pass 1 reads the dirty objects of the range and builds the key -> latest offset map
  (`log_cleaner.OffsetMap`, at most `max_keys` keys per partition per run: the range stops
  at the object where the map fills; the rest is cleaned by a later run); the clean
  objects are not mapped (each of their keys is there once already), as in Kafka;
* pass 2 reads every object of the range (clean ones too: a newer dirty record, or an
  expired tombstone, removes records from them) and rewrites every batch
  (`log_cleaner.clean_stream_batch`).

It runs as two Spark stages: `survey_stream` (passes 1 and 2 without writing) says which
objects lose records; the driver prepares object ids for exactly those (a run with nothing
to remove prepares and writes nothing); `clean_stream` (passes 1 and 2 again, deterministic
for the same `now_ms`) rewrites them and PUTs them under the prepared ids. So a dirty
object is read three times (four when rewritten), a clean one once (twice when rewritten):
cheap next to never leaving unused PREPARED ids in the metadata on every scheduled run.

The driver commits every rewritten object in ONE `commit_stream_set_object` with
`compacted_object_ids` (the controller's `check_compaction` checks the new objects hold
exactly the live offsets of the old ones and refuses a run that lost a race whole), then
records each cleaned partition's new checkpoint (`survey_stream`'s `cleaned_offset`: the
end of its range) with `set_cleaner_checkpoints`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane import topic_configs
from controlplane.broker_configs import topic_configs_in_force
from controlplane.image import MetadataImage
from controlplane.records import ObjectState
from dataplane.formats.object_format import ObjectWriter, decode_block, parse_object
from spark_jobs import objects_io
from spark_jobs.cleaner_policy import CleanDecision, decide
from spark_jobs.log_cleaner import (
    DEFAULT_MAX_MAP_ENTRIES,
    OffsetMap,
    add_stream_batches,
    clean_stream_batch,
    max_timestamp,
)

BLOCK_SIZE_BYTES = 512 * 1024
MAX_OBJECT_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class CleanSource:
    """A committed stream object of a compacted partition."""

    object_id: int
    bucket_id: int
    size_bytes: int
    start_offset: int
    end_offset: int


@dataclass
class CleanTask:
    """One partition's cleanable objects and the configs that govern them."""

    stream_id: int
    topic: str
    partition: int
    trim_offset: int  # the stream's start: batches ending at or below it are dropped
    delete_retention_ms: int
    min_compaction_lag_ms: int
    sources: list[CleanSource] = field(default_factory=list)
    # the cleaner checkpoint: objects ending at or below it are clean (not mapped again)
    cleaned_offset: int = 0
    decision: CleanDecision | None = None
    # source object id -> the id its rewrite gets (prepared by the driver after the survey)
    new_object_ids: dict[int, int] = field(default_factory=dict)


def is_compacted(policy: str) -> bool:
    return "compact" in [p.strip() for p in policy.split(",")]


def compacted_streams(image: MetadataImage) -> dict[int, tuple[str, int, dict[str, str]]]:
    """stream id -> (topic, partition, configs in force) of every compacted partition."""
    found: dict[int, tuple[str, int, dict[str, str]]] = {}
    for topic in image.topics.values():
        for part in topic.partitions.values():
            configs = topic_configs_in_force(image, topic.configs, part.leader_node_id)
            if is_compacted(topic_configs.effective(configs, "cleanup.policy")):
                found[part.stream_id] = (topic.name, part.partition, configs)
    return found


FirstDirtyTimestamp = Callable[[CleanTask, CleanSource], int | None]


def _no_timestamp(task: CleanTask, source: CleanSource) -> int | None:
    return None


def select_clean_tasks(
    image: MetadataImage,
    max_run_bytes: int,
    max_objects: int,
    now_ms: int | None = None,
    first_dirty_timestamp_ms: FirstDirtyTimestamp = _no_timestamp,
    skipped: list[CleanTask] | None = None,
) -> list[CleanTask]:
    """The compacted partitions to clean now, each with its contiguous committed stream
    objects from the stream's start (pure but for `first_dirty_timestamp_ms`, called only
    when `max.compaction.lag.ms` can decide, see `cleaner_policy`); at most `max_objects`
    objects and about `max_run_bytes` in the run. Partitions the policy skips are appended
    to `skipped` (with their `decision`)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    by_stream: dict[int, list] = {}
    for so in image.stream_objects.values():
        meta = image.objects.get(so.object_id)
        if meta is not None and meta.state == ObjectState.COMMITTED:
            by_stream.setdefault(so.stream_id, []).append((so, meta))
    tasks: list[CleanTask] = []
    total_bytes = 0
    total_objects = 0
    for stream_id, (topic, partition, configs) in sorted(compacted_streams(image).items()):
        stream = image.streams.get(stream_id)
        if stream is None or stream_id not in by_stream:
            continue
        task = CleanTask(
            stream_id,
            topic,
            partition,
            stream.start_offset,
            topic_configs.effective_int(configs, "delete.retention.ms"),
            topic_configs.effective_int(configs, "min.compaction.lag.ms"),
            cleaned_offset=stream.cleaned_offset,
        )
        expected = None
        for so, meta in sorted(by_stream[stream_id], key=lambda x: x[0].start_offset):
            if so.end_offset <= stream.start_offset:
                continue  # wholly trimmed: the object compaction destroys it
            if expected is not None and so.start_offset != expected:
                break  # a gap (that data is still in a stream-set object): stop here
            task.sources.append(
                CleanSource(
                    so.object_id, meta.bucket_id, meta.size_bytes, so.start_offset, so.end_offset
                )
            )
            expected = so.end_offset
        if not task.sources:
            continue
        dirty = [s for s in task.sources if s.end_offset > task.cleaned_offset]
        task.decision = decide(
            sum(s.size_bytes for s in task.sources) - sum(s.size_bytes for s in dirty),
            sum(s.size_bytes for s in dirty),
            float(topic_configs.effective(configs, "min.cleanable.dirty.ratio")),
            topic_configs.effective_int(configs, "max.compaction.lag.ms"),
            now_ms,
            lambda task=task, dirty=dirty: first_dirty_timestamp_ms(task, dirty[0]),
        )
        if not task.decision.clean:
            if skipped is not None:
                skipped.append(task)
            continue
        within: list[CleanSource] = []
        for source in task.sources:
            if total_objects >= max_objects or (
                total_bytes and total_bytes + source.size_bytes > max_run_bytes
            ):
                break
            within.append(source)
            total_bytes += source.size_bytes
            total_objects += 1
        task.sources = within
        if task.sources:
            tasks.append(task)
    return tasks


def first_batch_max_timestamp(task: CleanTask, source: CleanSource, bucket_uri: str) -> int | None:
    """The max timestamp of the stream's first batch in `source` (Kafka's "first batch
    timestamp" of a segment): the object's index, then its first block (two ranged GETs)."""
    entries = objects_io.read_index(bucket_uri, source.object_id, source.size_bytes)
    for entry in sorted(entries, key=lambda e: e.position):
        if entry.stream_id != task.stream_id:
            continue
        block = objects_io.get_range(
            bucket_uri, source.object_id, entry.position, entry.end_position
        )
        for batch in decode_block(memoryview(block), entry):
            if batch.stream_id == task.stream_id:
                return max_timestamp(batch)
    return None


def _batches(bucket_uri: str, source: CleanSource):
    data = objects_io.get_range(bucket_uri, source.object_id, 0, source.size_bytes)
    _, entries = parse_object(data)
    view = memoryview(data)
    for entry in entries:
        yield from decode_block(view[entry.position : entry.end_position], entry)


def _offset_map(
    task: CleanTask, buckets: dict[int, str], now_ms: int, max_keys: int
) -> tuple[OffsetMap, list[CleanSource], str, int]:
    """Pass 1: the key map of the cleanable range, its objects, why it stopped early ("" if
    it did not) and the bytes read. Deterministic for the same arguments (objects are
    immutable), so the survey and the rewrite see the same range and map."""
    offsets = OffsetMap(max_keys)
    lag_horizon_ms = now_ms - task.min_compaction_lag_ms
    cleanable: list[CleanSource] = []
    bytes_read = 0
    for source in task.sources:
        if source.end_offset <= task.cleaned_offset:
            cleanable.append(source)  # clean: its keys are there once already, not mapped
            continue
        batches = [
            b for b in _batches(buckets[source.bucket_id], source) if b.stream_id == task.stream_id
        ]
        bytes_read += source.size_bytes
        if task.min_compaction_lag_ms and any(max_timestamp(b) > lag_horizon_ms for b in batches):
            return offsets, cleanable, "min.compaction.lag.ms", bytes_read
        if not add_stream_batches(offsets, batches):  # all of the object's keys, or none
            return offsets, cleanable, f"the offset map is full ({max_keys} keys)", bytes_read
        cleanable.append(source)
    return offsets, cleanable, "", bytes_read


def _cleaned(
    task: CleanTask, bucket_uri: str, source: CleanSource, offsets: OffsetMap, now_ms: int
) -> tuple[ObjectWriter, int]:
    """Pass 2 over one object: its cleaned batches in a writer, and the records removed."""
    writer = ObjectWriter(BLOCK_SIZE_BYTES, MAX_OBJECT_BYTES)
    removed = 0
    for batch in _batches(bucket_uri, source):
        if batch.stream_id != task.stream_id or batch.last_offset <= task.trim_offset:
            continue
        cleaned, lost = clean_stream_batch(batch, offsets, now_ms, task.delete_retention_ms)
        removed += lost
        writer.add(cleaned)
    return writer, removed


def survey_stream(
    task: CleanTask,
    buckets: dict[int, str],
    now_ms: int,
    max_keys: int = DEFAULT_MAX_MAP_ENTRIES,
) -> dict:
    """Which of the partition's objects lose records (runs in a Spark worker; writes
    nothing): `rewrite` (source object ids) and counters. The driver prepares object ids
    only for those, so a run with nothing to remove leaves nothing behind."""
    started = time.monotonic()
    offsets, cleanable, stopped, bytes_read = _offset_map(task, buckets, now_ms, max_keys)
    rewrite: list[int] = []
    removable = 0
    for source in cleanable:
        _, removed = _cleaned(task, buckets[source.bucket_id], source, offsets, now_ms)
        bytes_read += source.size_bytes
        if removed:
            rewrite.append(source.object_id)
            removable += removed
    return {
        "stream_id": task.stream_id,
        "topic": task.topic,
        "partition": task.partition,
        "rewrite": rewrite,
        "cleanable_objects": len(cleanable),
        "keys": len(offsets),
        "removable_records": removable,
        "stopped": stopped,
        # the new checkpoint: the end of the range mapped in this run
        "cleaned_offset": max(
            [task.cleaned_offset]
            + [s.end_offset for s in cleanable if s.end_offset > task.cleaned_offset]
        ),
        "bytes_read": bytes_read,
        "task_s": time.monotonic() - started,
    }


def clean_stream(
    task: CleanTask,
    buckets: dict[int, str],
    target_bucket_id: int,
    now_ms: int,
    max_keys: int = DEFAULT_MAX_MAP_ENTRIES,
) -> dict:
    """Rewrite the partition's objects named in `task.new_object_ids` (source id -> new
    id, from the survey with the same `now_ms` and `max_keys`) and PUT them (runs in a
    Spark worker): the descriptors (`new`: [{object_id, replaces, stream_id, size_bytes,
    start_offset, end_offset, removed_records}]) and counters."""
    started = time.monotonic()
    offsets, cleanable, _, bytes_read = _offset_map(task, buckets, now_ms, max_keys)
    new: list[dict] = []
    for source in cleanable:
        object_id = task.new_object_ids.get(source.object_id)
        if object_id is None:
            continue  # nothing to remove in it: the object stays
        writer, removed = _cleaned(task, buckets[source.bucket_id], source, offsets, now_ms)
        bytes_read += source.size_bytes
        obj = writer.finish()
        objects_io.put(buckets[target_bucket_id], object_id, obj.data)
        (rng,) = obj.ranges
        new.append(
            {
                "object_id": object_id,
                "replaces": source.object_id,
                "stream_id": task.stream_id,
                "size_bytes": obj.size_bytes,
                "start_offset": rng.start_offset,
                "end_offset": rng.end_offset,
                "removed_records": removed,
            }
        )
    return {
        "stream_id": task.stream_id,
        "new": new,
        "bytes_read": bytes_read,
        "task_s": time.monotonic() - started,
    }
