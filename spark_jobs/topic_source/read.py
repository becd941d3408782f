"""The executor side of the `automq` source: one split's records, read from the objects.

For each object piece of the split: the object's index (one tail GET, objects_io), the
blocks of the partition's stream that overlap the piece (`find_blocks`), their bytes in
ranged GETs of up to 8 MiB (touching blocks merged), each block checked and decoded by the
object format (`decode_block`: framing, CRC32C, index agreement) into the stored Kafka
batches, and each batch's records decoded into columns by the lean decoder
(dataplane.formats.records: gzip, snappy, lz4, zstd), handed to Spark as Arrow batches. Control batches are never returned; under read_committed a transactional batch
whose producer has an aborted transaction covering it (the controller's transaction index)
is dropped. Records outside [split start, split end) are dropped (a block or a batch may
straddle a split boundary); so are records below `min_timestamp_ms` when it is set.

Each object is read from the bucket it was written to (its URI is in the split); the
credentials come from the executor's environment (objects_io). Any failure names the
object, its bucket and key (`TopicSourceError`).

Thread-safety: `split_records` runs in one Spark task; the next piece is fetched and
decoded by one prefetch thread while the task decodes the current one, and the GETs run on
a pool of objects_io.IO_THREADS threads that only fetch bytes (both per split, bounded).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from dataplane.formats.object_format import decode_block, find_blocks
from dataplane.formats.record_batch import parse_batch_header
from dataplane.formats.records import RecordColumns, decode_records
from dataplane.objectstore import BucketURI, object_key
from spark_jobs import objects_io
from spark_jobs.topic_source.options import TopicSourceError
from spark_jobs.topic_source.plan import PieceRead, TopicSplit

ROWS_PER_ARROW_BATCH = 8192
MAX_PIECE_READ_BYTES = 1 << 62  # find_blocks' byte limit: every block of the piece


class AbortedIndex:
    """Aborted transactions of one split, per producer: (first offset, marker offset)
    sorted, so `aborted(pid, offset)` is a bisect (pure; one task's)."""

    def __init__(self, entries: tuple[tuple[int, int, int], ...]) -> None:
        self._by_producer: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first, marker in entries:
            self._by_producer.setdefault(producer_id, []).append((first, marker))
        for spans in self._by_producer.values():
            spans.sort()

    def aborted(self, producer_id: int, offset: int) -> bool:
        """Whether `offset` of a transactional batch of `producer_id` is in an aborted
        transaction (first offset <= offset < marker offset)."""
        spans = self._by_producer.get(producer_id)
        if not spans:
            return False
        i = bisect.bisect_right(spans, (offset, 1 << 63)) - 1
        return i >= 0 and spans[i][0] <= offset < spans[i][1]


def _where(piece: PieceRead) -> str:
    try:
        bucket = BucketURI.parse(piece.bucket_uri)
        place = f"bucket {bucket.bucket_id} ({bucket.bucket})"
    except Exception:  # noqa: BLE001 - the message still names the object
        place = "its bucket"
    return f"object {piece.object_id} ({place}, key {object_key(piece.object_id)})"


def _piece_batches(split: TopicSplit, piece: PieceRead, pool: ThreadPoolExecutor) -> list:
    """The stored batches of `split`'s stream in `piece` (StreamRecordBatch, offset order)."""
    index = objects_io.read_index(piece.bucket_uri, piece.object_id, piece.object_size_bytes)
    blocks = find_blocks(
        index, split.stream_id, piece.start_offset, piece.end_offset, MAX_PIECE_READ_BYTES
    )
    if not blocks:
        raise TopicSourceError(
            f"offsets {piece.start_offset}..{piece.end_offset} of stream {split.stream_id} "
            "are not in the object's index"
        )
    gets = objects_io.spans(blocks)
    chunks = list(
        pool.map(lambda g: objects_io.get_range(piece.bucket_uri, piece.object_id, *g), gets)
    )
    out = []
    for entry in blocks:
        for (start, _end), chunk in zip(gets, chunks, strict=True):
            if start <= entry.position and entry.end_position <= start + len(chunk):
                raw = memoryview(chunk)[entry.position - start : entry.end_position - start]
                out.extend(decode_block(raw, entry))
                break
    return out


def _append_records(split: TopicSplit, batch, aborted: AbortedIndex, out: RecordColumns) -> None:
    """Append the returned records of one stored batch to `out` (the lean decoder)."""
    if batch.is_link:
        raise TopicSourceError(f"a link record at offset {batch.base_offset} (not resolved)")
    payload = batch.payload
    if not payload:
        return  # a filler (sealed erasure-coded ranges): no records
    header = parse_batch_header(payload, 0, copy=False)
    if header.is_control:
        return
    if (
        split.read_committed
        and header.is_transactional
        and aborted.aborted(header.producer_id, header.base_offset)
    ):
        return
    lo, hi, min_ts = split.start_offset, split.end_offset, split.min_timestamp_ms
    first = len(out)
    decode_records(header, out)
    if header.base_offset >= lo and header.last_offset < hi and min_ts is None:
        return  # the whole batch (the common case): nothing to filter
    keep = [
        i
        for i in range(first, len(out))
        if lo <= out.offsets[i] < hi and (min_ts is None or out.timestamps_ms[i] >= min_ts)
    ]
    for column in out.columns():
        column[first:] = [column[i] for i in keep]


def split_columns(split: TopicSplit, rows_per_batch: int = ROWS_PER_ARROW_BATCH) -> Iterator:
    """The split's returned records in offset order, as RecordColumns of at least
    `rows_per_batch` rows (the last one fewer). The same object is yielded each time and
    cleared after the consumer resumes: use its columns before asking for the next."""
    aborted = AbortedIndex(split.aborted_txns)
    out = RecordColumns()
    with (
        ThreadPoolExecutor(objects_io.IO_THREADS, thread_name_prefix="topic-source-get") as gets,
        ThreadPoolExecutor(1, thread_name_prefix="topic-source-prefetch") as prefetch,
    ):
        ahead = None  # the next piece's batches, fetched while this one is decoded
        for i, piece in enumerate(split.pieces):
            future = ahead or prefetch.submit(_piece_batches, split, piece, gets)
            ahead = (
                prefetch.submit(_piece_batches, split, split.pieces[i + 1], gets)
                if i + 1 < len(split.pieces)
                else None
            )
            try:
                batches = future.result()
                for batch in batches:
                    if batch.last_offset <= split.start_offset:
                        continue
                    if batch.base_offset >= split.end_offset:
                        break
                    _append_records(split, batch, aborted, out)
                    if len(out) >= rows_per_batch:
                        yield out
                        out.clear()
            except TopicSourceError as exc:
                raise TopicSourceError(
                    f"{split.topic}-{split.partition}: {_where(piece)}: {exc}"
                ) from None
            except Exception as exc:  # noqa: BLE001 - S3, CRC, decoding: name the object
                raise TopicSourceError(
                    f"{split.topic}-{split.partition}: cannot read {_where(piece)}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
    if len(out):
        yield out


def split_records(split: TopicSplit) -> Iterator[tuple]:
    """Every returned record of the split, in offset order: (key, value, offset,
    timestamp ms, timestamp type, headers as [(key, value)])."""
    for cols in split_columns(split):
        yield from zip(
            cols.keys,
            cols.values,
            cols.offsets,
            cols.timestamps_ms,
            cols.timestamp_types,
            cols.headers,
            strict=True,
        )


def arrow_batches(split: TopicSplit) -> Iterator:
    """The split's rows as pyarrow RecordBatches of the source's schema."""
    import pyarrow as pa

    from spark_jobs.topic_source.schema import ARROW_SCHEMA

    ts_type = ARROW_SCHEMA.field("timestamp").type
    headers_type = ARROW_SCHEMA.field("headers").type
    topic = pa.scalar(split.topic, pa.string())
    partition = pa.scalar(split.partition, pa.int32())
    for cols in split_columns(split):
        n = len(cols)
        arrays = [
            pa.array(cols.keys, pa.binary()),
            pa.array(cols.values, pa.binary()),
            pa.repeat(topic, n),
            pa.repeat(partition, n),
            pa.array(cols.offsets, pa.int64()),
            pa.array(cols.timestamps_ms, pa.timestamp("ms", tz="UTC")).cast(ts_type),
            pa.array(cols.timestamp_types, pa.int32()),
            _headers_array(cols.headers, headers_type),
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _headers_array(headers: list, headers_type):
    """The headers column: all-empty lists (the common case) built without a Python walk."""
    import pyarrow as pa

    if any(headers):
        return pa.array(headers, headers_type)
    offsets = pa.array([0] * (len(headers) + 1), pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array([], headers_type.value_type))
