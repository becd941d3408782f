"""`spark.read.format("automq")` and `spark.readStream.format("automq")`: topics read
straight from object storage with Spark 4's Python Data Source API.

    from spark_jobs.topic_source import AutomqDataSource
    spark.dataSource.register(AutomqDataSource)          # or topic_source.register(spark)
    df = (spark.read.format("automq").option("cluster", "/path/to/cluster-dir")
          .option("topic", "orders").load())

The driver plans from the controller's metadata (`plan`); executors read the committed
objects from the buckets (`read`), never through a broker. The stream's offsets are
Spark's Kafka-source JSON ({"orders": {"0": 23, "1": 40}}), checkpointed by Spark: a
micro-batch reads exactly the offsets [start, end) it was planned with, from whatever
objects hold them when it runs (compaction may have rewritten them), so a query restarted
from its checkpoint neither skips nor repeats a record. See docs/spark.md.

Thread-safety: Spark creates one reader per query on the driver and pickles it to tasks;
nothing here is shared between threads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from spark_jobs.topic_source.options import SourceOptions, TopicSourceError, parse_options
from spark_jobs.topic_source.plan import (
    ClusterAccess,
    PartitionRange,
    TopicSplit,
    cluster_access,
    load_image,
    offsets_json,
    partition_ranges,
    selected_partitions,
    splits,
)
from spark_jobs.topic_source.read import arrow_batches
from spark_jobs.topic_source.schema import SCHEMA_DDL
from spark_jobs.topic_source.stable import bootstrap_from_image, last_stable_offsets

FORMAT_NAME = "automq"


class SplitPartition(InputPartition):
    """One Spark partition: a TopicSplit (picklable)."""

    def __init__(self, split: TopicSplit) -> None:
        super().__init__(split)
        self.split = split


class AutomqDataSource(DataSource):
    """The `automq` format (batch and streaming reads of topics)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> DataSourceReader:
        return TopicBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return TopicStreamReader(parse_options(self.options, streaming=True))


def _plan(
    opts: SourceOptions, starts=None, ends=None, stable: bool = False
) -> tuple[ClusterAccess, object, list[PartitionRange]]:
    """The ranges to read; `stable`: under read_committed, each end capped at the
    partition's last stable offset (asked of the brokers before the image is read)."""
    access = cluster_access(opts.cluster, opts.buckets)
    lso = None
    if stable and opts.read_committed:
        before = load_image(access)
        config = dict(opts.kafka)
        config.setdefault("bootstrap.servers", bootstrap_from_image(before))
        wanted = [(t, p) for t, p, _ in selected_partitions(before, opts)]
        lso = last_stable_offsets(config, wanted)
    image = load_image(access)
    ranges = partition_ranges(image, opts, starts, ends)
    for rng in ranges if lso is not None else ():
        cap = lso.get((rng.topic, rng.partition))
        if cap is not None and 0 <= cap < rng.end:
            rng.end = max(rng.start, cap)
    return access, image, ranges


class TopicBatchReader(DataSourceReader):
    """A batch read: the offsets are fixed when the reader is made (on the driver)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        access, image, ranges = _plan(opts, stable=True)
        self._splits = splits(image, ranges, opts, access.buckets)

    def partitions(self) -> Sequence[InputPartition]:
        # Spark needs at least one partition: an empty read is one empty split list
        return [SplitPartition(s) for s in self._splits] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator:
        split = getattr(partition, "split", None)
        if split is not None:
            yield from arrow_batches(split)


def _as_offsets(value: dict) -> dict[str, dict[int, int]]:
    try:
        return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in value.items()}
    except (AttributeError, TypeError, ValueError):
        raise TopicSourceError(f"not an offsets JSON of this source: {value!r}") from None


def limit_ends(ranges: list[PartitionRange], max_offsets: int | None) -> None:
    """Cap a micro-batch at `max_offsets` offsets, shared by the partitions in proportion to
    what each has to read (as Spark's Kafka source's maxOffsetsPerTrigger); every partition
    with something to read advances."""
    lags = [max(r.end - r.start, 0) for r in ranges]
    total = sum(lags)
    if max_offsets is None or total <= max_offsets:
        return
    for rng, lag in zip(ranges, lags, strict=True):
        if lag:
            rng.end = rng.start + max(1, lag * max_offsets // total)


class TopicStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream: micro-batches of committed offsets, checkpointed by Spark."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # Trigger.AvailableNow: the committed ends when the query started (the target)
        self._target: dict[str, dict[int, int]] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        _, _, ranges = _plan(self.opts, None, "latest", stable=True)
        self._target = _as_offsets(offsets_json(ranges, "end"))

    def initialOffset(self) -> dict:
        _, _, ranges = _plan(self.opts)
        return offsets_json(ranges, "start")

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        starts = _as_offsets(start) if start else None
        _, _, ranges = _plan(self.opts, starts, "latest", stable=True)
        if self._target is not None:  # AvailableNow: nothing past the target
            for rng in ranges:
                cap = self._target.get(rng.topic, {}).get(rng.partition, rng.start)
                rng.end = max(rng.start, min(rng.end, cap))
        max_rows = getattr(limit, "max_rows", None)
        if limit is None and starts is not None:
            max_rows = self.opts.max_offsets_per_trigger
        limit_ends(ranges, max_rows)
        return offsets_json(ranges, "end")

    def reportLatestOffset(self) -> dict | None:
        _, _, ranges = _plan(self.opts, None, "latest")
        return offsets_json(ranges, "end")

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        starts, ends = _as_offsets(start), _as_offsets(end)
        access, image, ranges = _plan(self.opts, starts, ends)
        # a partition new since `start` began at its log start (as Spark's Kafka source);
        # one not in `end` is not read in this micro-batch
        ranges = [r for r in ranges if r.partition in ends.get(r.topic, {})]
        return [SplitPartition(s) for s in splits(image, ranges, self.opts, access.buckets)]

    def read(self, partition: InputPartition) -> Iterator:
        yield from arrow_batches(partition.split)

    def commit(self, end: dict) -> None:
        """Nothing to release: the source holds no state between micro-batches."""


def register(spark) -> None:
    """Register the `automq` format with a SparkSession (Spark 4's Python data sources)."""
    spark.dataSource.register(AutomqDataSource)
