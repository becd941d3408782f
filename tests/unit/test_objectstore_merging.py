"""Range-read merging: nearby concurrent reads share one GET and get byte-exact slices."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future

import pytest
from botocore.config import Config as BotoConfig
from moto import mock_aws
from prometheus_client import CollectorRegistry

from dataplane.objectstore import (
    BucketURI,
    InvalidRangeError,
    ObjectNotFoundError,
    ObjectStorage,
    ObjectStoreMetrics,
    Priority,
)
from dataplane.objectstore.clients import default_client_factory
from dataplane.objectstore.merging import RangeMerger, ReadBatch

KiB = 1024
MiB = 1024 * KiB
URIS = "0@s3://automq-main?region=us-east-1"
# a generous window: the test threads must land inside it even on a loaded 2-core machine
WINDOW_MS = 200.0


@pytest.fixture
def objects(monkeypatch):
    """moto with three random objects; yields {key: bytes}."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    rng = random.Random(7)
    data = {f"obj{i}": rng.randbytes(size) for i, size in enumerate((1 * MiB, 300 * KiB, 5000))}
    with mock_aws():
        s3 = default_client_factory(BucketURI(bucket_id=0, bucket="automq-main"), BotoConfig())
        s3.create_bucket(Bucket="automq-main")
        for key, body in data.items():
            s3.put_object(Bucket="automq-main", Key=key, Body=body)
        yield data


@pytest.fixture
def registry():
    return CollectorRegistry()


def make_store(registry, **overrides) -> ObjectStorage:
    options = dict(merge_window_ms=WINDOW_MS, max_concurrency=8)
    options.update(overrides)
    return ObjectStorage(URIS, metrics=ObjectStoreMetrics(registry), **options)


def count_gets(store: ObjectStorage) -> list[str]:
    """The Range header of every GetObject the store sends."""
    ranges: list[str] = []
    lock = threading.Lock()

    def record(params, **_):
        with lock:
            ranges.append(params.get("Range", ""))

    store.boto3_client(0).meta.events.register("before-parameter-build.s3.GetObject", record)
    return ranges


def concurrent_reads(store, key, ranges, priority=Priority.CATCH_UP) -> list[Future]:
    """Submit every range from its own thread, all released together by a barrier."""
    futures: list[Future | None] = [None] * len(ranges)
    barrier = threading.Barrier(len(ranges))

    def submit(i: int) -> None:
        barrier.wait(timeout=5)
        futures[i] = store.get_range_async(0, key, ranges[i][0], ranges[i][1], priority)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(ranges))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(f is not None for f in futures)
    return futures  # type: ignore[return-value]


def test_concurrent_nearby_ranges_are_served_by_one_get(objects, registry):
    data = objects["obj0"]
    ranges = [(i * 64 * KiB, (i + 1) * 64 * KiB) for i in range(8)]
    random.Random(1).shuffle(ranges)
    # the longest window allowed: eight threads released together may be spread over more
    # than 200 ms on a loaded machine (a range past the window gets a GET of its own)
    with make_store(registry, merge_window_ms=1_000) as store:
        gets = count_gets(store)
        futures = concurrent_reads(store, "obj0", ranges)
        results = [f.result(timeout=10) for f in futures]
        assert results == [data[s:e] for s, e in ranges]
        assert gets == [f"bytes=0-{8 * 64 * KiB - 1}"]
        # slices of the one body, not copies of it (read-only: nobody can change them)
        bodies = {id(r.obj) for r in results}
        assert len(bodies) == 1 and all(r.readonly for r in results)
        merged = registry.get_sample_value(
            "automq_object_store_merged_ranges_total", {"bucket_id": "0"}
        )
        assert merged == 8


def test_overlapping_gapped_and_duplicate_ranges(objects, registry):
    data = objects["obj0"]
    ranges = [
        (0, 100),
        (50, 150),
        (50, 150),
        (100 * KiB, 101 * KiB),  # gap < 512 KiB
        (300 * KiB, 300 * KiB + 1),
    ]
    # submitted in order, only the last range brings the span to merge_max_bytes: the one
    # GET goes out as it joins, not at the end of a window a stalled thread could outlast
    with make_store(registry, merge_window_ms=1_000, merge_max_bytes=300 * KiB + 1) as store:
        gets = count_gets(store)
        futures = [store.get_range_async(0, "obj0", s, e) for s, e in ranges]
        assert [f.result(timeout=10) for f in futures] == [data[s:e] for s, e in ranges]
        assert gets == [f"bytes=0-{300 * KiB}"]


def test_merging_disabled_with_zero_window(objects, registry):
    data = objects["obj0"]
    ranges = [(i * 1000, i * 1000 + 1000) for i in range(6)]
    with make_store(registry, merge_window_ms=0) as store:
        gets = count_gets(store)
        futures = concurrent_reads(store, "obj0", ranges)
        assert [f.result(timeout=10) for f in futures] == [data[s:e] for s, e in ranges]
        assert len(gets) == 6


def test_ranges_further_apart_than_the_gap_are_not_merged(objects, registry):
    data = objects["obj0"]
    ranges = [(0, 100), (100, 200), (600 * KiB, 600 * KiB + 100)]
    with make_store(registry, merge_gap_bytes=1000) as store:
        gets = count_gets(store)
        futures = [store.get_range_async(0, "obj0", s, e) for s, e in ranges]
        assert [f.result(timeout=10) for f in futures] == [data[s:e] for s, e in ranges]
        assert sorted(gets) == ["bytes=0-199", f"bytes={600 * KiB}-{600 * KiB + 99}"]


def test_merged_span_never_exceeds_merge_max_bytes(objects, registry):
    data = objects["obj0"]
    ranges = [(i * 64 * KiB, (i + 1) * 64 * KiB) for i in range(10)]
    with make_store(registry, merge_max_bytes=256 * KiB) as store:
        gets = count_gets(store)
        futures = [store.get_range_async(0, "obj0", s, e) for s, e in ranges]
        results = [f.result(timeout=10) for f in futures]
        assert results == [data[s:e] for s, e in ranges]
        spans = []
        for header in gets:
            lo, hi = header.removeprefix("bytes=").split("-")
            spans.append(int(hi) + 1 - int(lo))
        assert max(spans) <= 256 * KiB
        assert sorted(spans) == [128 * KiB, 256 * KiB, 256 * KiB]
    # a single range above merge_max_bytes bypasses merging altogether
    with make_store(registry, merge_max_bytes=100 * KiB) as store:
        gets = count_gets(store)
        assert (
            store.get_range_async(0, "obj0", 0, 200 * KiB).result(timeout=10) == data[: 200 * KiB]
        )
        assert gets == [f"bytes=0-{200 * KiB - 1}"]


def test_different_objects_and_buckets_are_not_merged(objects, registry):
    with make_store(registry) as store:
        gets = count_gets(store)
        a = store.get_range_async(0, "obj0", 0, 10)
        b = store.get_range_async(0, "obj1", 0, 10)
        assert a.result(timeout=10) == objects["obj0"][:10]
        assert b.result(timeout=10) == objects["obj1"][:10]
        assert len(gets) == 2


def test_short_object_fails_only_the_ranges_past_its_end(objects, registry):
    data = objects["obj2"]  # 5000 bytes
    with make_store(registry) as store:
        gets = count_gets(store)
        ok = store.get_range_async(0, "obj2", 0, 4000)
        past = store.get_range_async(0, "obj2", 4500, 6000)
        assert ok.result(timeout=10) == data[:4000]
        with pytest.raises(InvalidRangeError, match="past the end"):
            past.result(timeout=10)
        assert len(gets) == 1
        # a lone read of the same range fails the same way
        with pytest.raises(InvalidRangeError):
            store.get_range(0, "obj2", 4500, 6000)


def test_missing_object_fails_every_member(objects, registry):
    with make_store(registry) as store:
        futures = [store.get_range_async(0, "nope", i * 10, i * 10 + 10) for i in range(4)]
        for f in futures:
            with pytest.raises(ObjectNotFoundError):
                f.result(timeout=10)


def test_cancelled_members_are_skipped(objects, registry):
    data = objects["obj0"]
    with make_store(registry) as store:
        gets = count_gets(store)
        keep = store.get_range_async(0, "obj0", 0, 100)
        drop = store.get_range_async(0, "obj0", 900 * KiB, 1 * MiB)
        assert drop.cancel()
        assert keep.result(timeout=10) == data[:100]
        assert gets == ["bytes=0-99"]  # the span shrank to the live member
        lonely = store.get_range_async(0, "obj1", 0, 100)
        assert lonely.cancel()
    assert len(gets) == 1  # an all-cancelled batch makes no GET


def test_stress_many_threads_random_ranges_are_byte_exact(objects, registry):
    rng = random.Random(12345)
    keys = list(objects)
    plans = []
    for _ in range(16):
        plan = []
        for _ in range(25):
            key = rng.choice(keys)
            size = len(objects[key])
            start = rng.randrange(0, size)
            end = min(size, start + rng.randrange(1, 200 * KiB))
            plan.append((key, start, end, rng.choice(list(Priority))))
        plans.append(plan)
    results: list[list] = [[] for _ in plans]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(plans))

    with make_store(registry, merge_window_ms=20, max_concurrency=4) as store:
        gets = count_gets(store)

        def worker(i: int) -> None:
            try:
                barrier.wait(timeout=5)
                futures = [store.get_range_async(0, k, s, e, p) for k, s, e, p in plans[i]]
                results[i] = [f.result(timeout=30) for f in futures]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    for plan, got in zip(plans, results):
        assert got == [objects[k][s:e] for k, s, e, _ in plan]
    total = sum(len(p) for p in plans)
    assert len(gets) < total  # merging happened
    merged = (
        registry.get_sample_value("automq_object_store_merged_ranges_total", {"bucket_id": "0"})
        or 0
    )
    assert merged > 0


def test_merger_flushes_on_window_and_on_close_without_a_store():
    executed: list[ReadBatch] = []
    done = threading.Event()

    def execute(batch: ReadBatch) -> None:
        executed.append(batch)
        done.set()

    # the window runs on a clock the test moves: on the real clock a submitting thread
    # stalled past a 20 ms window saw its first range flushed alone
    now = [1000.0]
    merger = RangeMerger(execute, window_s=0.02, gap_bytes=10, max_bytes=1000, clock=lambda: now[0])
    merger.submit(0, "k", 0, 10, Priority.COMPACTION)
    merger.submit(0, "k", 15, 30, Priority.PRODUCE)
    merger.submit(0, "k", 100, 110, Priority.CATCH_UP)  # beyond the gap: its own batch
    assert not done.wait(0.05)  # within the window nothing is flushed
    now[0] += 0.02  # the window ends: both batches go
    deadline = time.monotonic() + 5
    while len(executed) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted((b.start, b.end_exclusive, b.priority) for b in executed) == [
        (0, 30, Priority.PRODUCE),
        (100, 110, Priority.CATCH_UP),
    ]
    executed.clear()
    slow = RangeMerger(execute, window_s=60.0)
    slow.submit(0, "k", 0, 10, Priority.CATCH_UP)
    t0 = time.monotonic()
    slow.close()
    assert time.monotonic() - t0 < 5 and len(executed) == 1
    merger.close()


def test_per_request_gap_limit_merges_only_touching_ranges():
    executed: list[ReadBatch] = []

    merger = RangeMerger(executed.append, window_s=60.0, gap_bytes=100, max_bytes=1000)
    merger.submit(0, "k", 0, 10, Priority.CATCH_UP, max_gap_bytes=0)
    merger.submit(0, "k", 10, 20, Priority.CATCH_UP, max_gap_bytes=0)  # touching: merged
    merger.submit(0, "k", 30, 40, Priority.CATCH_UP, max_gap_bytes=0)  # a gap: its own
    merger.submit(0, "k", 45, 50, Priority.CATCH_UP)  # the merger's gap, but a member of
    merger.submit(0, "k", 200, 210, Priority.CATCH_UP)  # that batch allows none; this
    merger.submit(0, "k", 215, 220, Priority.CATCH_UP)  # and this one merge as usual
    merger.close()
    assert sorted((b.start, b.end_exclusive, len(b.members)) for b in executed) == [
        (0, 20, 2),
        (30, 40, 1),
        (45, 50, 1),
        (200, 220, 2),
    ]
    with pytest.raises(ValueError):
        RangeMerger(executed.append).submit(0, "k", 0, 1, Priority.CATCH_UP, max_gap_bytes=-1)


def test_store_passes_the_gap_limit_to_the_merger(objects, registry):
    data = objects["obj0"]
    ranges = [(0, 100), (100, 200), (300 * KiB, 301 * KiB)]
    # the three are submitted one after the other from this thread: a window long enough
    # that a preemption between two submissions on a loaded machine cannot split them
    with make_store(registry, merge_window_ms=1_000) as store:
        gets = count_gets(store)
        futures = [store.get_range_async(0, "obj0", s, e, max_gap_bytes=0) for s, e in ranges]
        assert [f.result(timeout=10) for f in futures] == [data[s:e] for s, e in ranges]
        assert sorted(gets) == sorted(["bytes=0-199", f"bytes={300 * KiB}-{301 * KiB - 1}"])
