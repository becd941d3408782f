"""The driver side of the `automq` source: which offsets of which partitions to read, and
how the read is split into Spark partitions (pure, given the controller's image).

Only committed data is read: a partition's readable range is [log start offset, the end
of the stream objects and stream-set objects that cover it contiguously) — what brokers
have uploaded and the controller committed. Nothing comes from a broker's WAL: records
not uploaded yet are left out (the next micro-batch, or a later batch read, sees them).

A split is a run of object pieces of one partition of about `split_bytes` (a piece is the
part of one object holding the partition's offsets; a large piece is cut by offsets), so a
large topic spreads over every executor. A split carries everything its executor needs:
each object's id, bucket URI (no secrets) and size, and, under read_committed, the
partition's aborted transactions (from the controller's transaction index) that overlap it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.client import ControllerClient
from controlplane.config import QuorumConfig
from controlplane.image import MetadataImage, StreamMetaState
from dataplane.kafka.time_index import stored_pieces
from spark_jobs.topic_source.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    TopicSourceError,
)

CONTROLLER_TIMEOUT_S = 30.0
MAX_SPLITS = 100_000


@dataclass(frozen=True)
class ClusterAccess:
    """How the driver reaches the cluster: controller API addresses, secret, CA, buckets."""

    controllers: tuple[str, ...]
    api_secret: str | None
    ca_file: str | None
    buckets: dict[int, str]


@dataclass(frozen=True)
class PieceRead:
    """Offsets [start_offset, end_offset) of one stream in one object."""

    object_id: int
    bucket_uri: str
    object_size_bytes: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class TopicSplit:
    """One Spark partition's work: offsets [start_offset, end_offset) of one topic
    partition, in the objects `pieces` (in offset order)."""

    topic: str
    partition: int
    stream_id: int
    start_offset: int
    end_offset: int
    pieces: tuple[PieceRead, ...]
    read_committed: bool
    # (producer id, first offset, marker offset) of aborted transactions overlapping the split
    aborted_txns: tuple[tuple[int, int, int], ...] = ()
    min_timestamp_ms: int | None = None


@dataclass
class PartitionRange:
    """A topic partition's offsets to read: [start, end); `log_start`/`committed_end` as
    the metadata has them now."""

    topic: str
    partition: int
    stream_id: int
    start: int
    end: int
    log_start: int
    committed_end: int
    notes: list[str] = field(default_factory=list)


def cluster_access(cluster: str, buckets: dict[int, str]) -> ClusterAccess:
    """`cluster` is a cluster directory (its quorum.json: controllers, API secret, TLS,
    buckets) or controller API addresses (secret and CA from the environment, as every
    controller client; the buckets then come from the `buckets` option)."""
    path = Path(cluster)
    if path.is_dir():
        qpath = path / "quorum.json"
        if not qpath.is_file():
            raise TopicSourceError(f"{cluster} is not a cluster directory (no quorum.json)")
        try:
            quorum = QuorumConfig.model_validate_json(qpath.read_text())
        except (OSError, ValueError) as exc:
            raise TopicSourceError(f"cannot read {qpath}: {exc}") from None
        ca = str(Path(quorum.tls_cert_file).parent / "ca.pem") if quorum.tls_cert_file else None
        own = {b.bucket_id: b.uri for b in quorum.buckets}
        return ClusterAccess(
            tuple(quorum.api_addresses()), quorum.api_secret, ca, {**own, **buckets}
        )
    addresses = []
    for part in cluster.split(","):
        address = re.sub(r"^https?://", "", part.strip()).rstrip("/")
        if not re.fullmatch(r"[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}", address):
            raise TopicSourceError(
                f"cluster {cluster!r}: neither a directory nor host:port controller addresses"
            )
        addresses.append(address)
    return ClusterAccess(tuple(addresses), None, None, dict(buckets))


def load_image(access: ClusterAccess) -> MetadataImage:
    """The controller leader's metadata image (one GET)."""
    client = ControllerClient(
        list(access.controllers),
        timeout_s=CONTROLLER_TIMEOUT_S,
        api_secret=access.api_secret,
        ca_file=access.ca_file,
    )
    try:
        raw = client.leader_get("/v1/image")
    except Exception as exc:  # noqa: BLE001 - any failure: the same clear message
        raise TopicSourceError(
            f"cannot read the metadata from the controllers {list(access.controllers)}: {exc}"
        ) from None
    if isinstance(raw, str):
        return MetadataImage.model_validate_json(raw)
    return MetadataImage.model_validate(raw)


def committed_end(stream: StreamMetaState) -> int:
    """The end of the objects covering the stream contiguously from its log start."""
    end = stream.start_offset
    for rng in sorted(stream.object_ranges, key=lambda r: r.start_offset):
        if rng.end_offset <= end:
            continue
        if rng.start_offset > end:
            break
        end = rng.end_offset
    return min(end, max(stream.end_offset, stream.start_offset))


def selected_partitions(image: MetadataImage, opts: SourceOptions) -> list[tuple[str, int, int]]:
    """(topic, partition, stream id) of the subscription, sorted; a named topic that does
    not exist is an error (a pattern may match none)."""
    if opts.pattern is not None:
        regex = re.compile(opts.pattern)
        names = sorted(n for n in image.topic_ids_by_name if regex.fullmatch(n))
    else:
        missing = [t for t in opts.topics if t not in image.topic_ids_by_name]
        if missing:
            raise TopicSourceError(f"topic {missing[0]!r} does not exist in the cluster")
        names = list(opts.topics)
    out = []
    for name in names:
        topic = image.topics[image.topic_ids_by_name[name]]
        wanted = opts.assign.get(name) if opts.assign else None
        if wanted is not None:
            unknown = [p for p in wanted if p not in topic.partitions]
            if unknown:
                raise TopicSourceError(f"partition {unknown[0]} of topic {name!r} does not exist")
        for pid, part in sorted(topic.partitions.items()):
            if wanted is not None and pid not in wanted:
                continue
            if part.erasure_coded:
                raise TopicSourceError(
                    f"{name}-{pid} is erasure-coded: its records are not in objects the "
                    "source reads (read it with a Kafka consumer)"
                )
            out.append((name, pid, part.stream_id))
    return out


def _offset_of(spec, topic: str, partition: int, default: int) -> int:
    if isinstance(spec, str):
        return EARLIEST if spec == "earliest" else LATEST
    return spec.get(topic, {}).get(partition, default)


def partition_ranges(
    image: MetadataImage,
    opts: SourceOptions,
    starts: dict[str, dict[int, int]] | None = None,
    ends: dict[str, dict[int, int]] | None = None,
) -> list[PartitionRange]:
    """The offsets to read of each selected partition. `starts`/`ends` (a stream's
    checkpointed offsets) override the options; below the log start offset is data loss
    (an error with failOnDataLoss, else the read starts at the log start)."""
    out = []
    for topic, pid, stream_id in selected_partitions(image, opts):
        stream = image.streams.get(stream_id)
        if stream is None:
            raise TopicSourceError(f"{topic}-{pid}: stream {stream_id} is not in the metadata")
        log_start, end_now = stream.start_offset, committed_end(stream)
        start = _offset_of(starts if starts is not None else opts.starting, topic, pid, EARLIEST)
        end = _offset_of(ends if ends is not None else opts.ending, topic, pid, LATEST)
        start = log_start if start == EARLIEST else end_now if start == LATEST else start
        end = end_now if end == LATEST else end
        rng = PartitionRange(topic, pid, stream_id, start, end, log_start, end_now)
        if start < log_start:
            if opts.fail_on_data_loss:
                raise TopicSourceError(
                    f"{topic}-{pid}: offset {start} is below the log start offset {log_start} "
                    "(removed by retention or DeleteRecords); set failOnDataLoss=false to "
                    "start at the log start"
                )
            rng.notes.append(f"offsets {start}..{log_start} were removed")
            rng.start = log_start
        if rng.end > end_now:
            raise TopicSourceError(
                f"{topic}-{pid}: ending offset {rng.end} is past the uploaded end {end_now} "
                "(records not in object storage yet are not read)"
            )
        rng.end = max(rng.end, rng.start)
        out.append(rng)
    return out


def _cut(lo: int, hi: int, size_bytes: int, split_bytes: int) -> list[tuple[int, int, int]]:
    """[lo, hi) cut into about split_bytes pieces by offsets: (lo, hi, estimated bytes)."""
    count = max(1, min(math.ceil(size_bytes / split_bytes), hi - lo))
    step = math.ceil((hi - lo) / count)
    return [
        (a, min(a + step, hi), size_bytes * (min(a + step, hi) - a) // max(hi - lo, 1))
        for a in range(lo, hi, step)
    ]


def splits(
    image: MetadataImage, ranges: list[PartitionRange], opts: SourceOptions, buckets: dict[int, str]
) -> list[TopicSplit]:
    """The Spark partitions of a read: each partition's range in runs of objects of about
    `opts.split_bytes` (see the module doc)."""
    out: list[TopicSplit] = []
    for rng in ranges:
        if rng.end <= rng.start:
            continue
        stream = image.streams[rng.stream_id]
        run: list[PieceRead] = []
        run_bytes = 0
        for piece in stored_pieces(image, rng.stream_id):
            lo, hi = max(piece.start_offset, rng.start), min(piece.end_offset, rng.end)
            if lo >= hi:
                continue
            meta = image.objects[piece.object_id]
            uri = buckets.get(meta.bucket_id)
            if uri is None:
                raise TopicSourceError(
                    f"object {piece.object_id} of {rng.topic}-{rng.partition} is in bucket "
                    f"{meta.bucket_id}, which has no URI here (option buckets)"
                )
            span = piece.end_offset - piece.start_offset
            piece_bytes = piece.size_bytes * (hi - lo) // max(span, 1)
            for a, b, est in _cut(lo, hi, piece_bytes, opts.split_bytes):
                if run and run_bytes + est > opts.split_bytes:
                    out.append(_split(rng, run, stream, opts))
                    run, run_bytes = [], 0
                run.append(PieceRead(piece.object_id, uri, meta.size_bytes, a, b))
                run_bytes += est
        if run:
            out.append(_split(rng, run, stream, opts))
        if len(out) > MAX_SPLITS:
            raise TopicSourceError(f"over {MAX_SPLITS} splits: raise automq.split.bytes")
    return out


def _split(
    rng: PartitionRange, run: list[PieceRead], stream: StreamMetaState, opts: SourceOptions
) -> TopicSplit:
    start, end = run[0].start_offset, run[-1].end_offset
    aborted = (
        tuple(tuple(a) for a in stream.aborted_txns if a[2] >= start and a[1] < end)
        if opts.read_committed
        else ()
    )
    return TopicSplit(
        topic=rng.topic,
        partition=rng.partition,
        stream_id=rng.stream_id,
        start_offset=start,
        end_offset=end,
        pieces=tuple(run),
        read_committed=opts.read_committed,
        aborted_txns=aborted,
        min_timestamp_ms=opts.starting_timestamp_ms,
    )


def offsets_json(ranges: list[PartitionRange], which: str) -> dict[str, dict[str, int]]:
    """{topic: {"partition": offset}} of the ranges' `start` or `end` (Spark's Kafka
    source's offset JSON)."""
    out: dict[str, dict[str, int]] = {}
    for rng in ranges:
        out.setdefault(rng.topic, {})[str(rng.partition)] = getattr(rng, which)
    return out
