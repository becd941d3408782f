"""BlockCache: watch counts, speculative (prefetched) blocks, their budget, claims, waste."""

from __future__ import annotations

import pytest

from dataplane.s3stream.block_cache import BlockCache

KiB = 1024
MiB = 1024 * KiB


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def loaded(cache: BlockCache, key, size: int) -> None:
    cache.fill(key, [], size)


def test_watched_block_is_freed_once_every_watcher_read_it():
    cache = BlockCache(8 * MiB)
    assert cache.watch((1, 0), "a", 100) is True  # the first watcher loads it
    assert cache.watch((1, 0), "b", 100) is False
    assert cache.watcher_count == 2
    loaded(cache, (1, 0), 100)
    cache.unwatch((1, 0), "a")
    assert cache.get((1, 0)) == []
    cache.unwatch((1, 0), "b")
    assert cache.get((1, 0)) is None and cache.used_bytes == 0 and cache.watcher_count == 0


def test_pending_future_resolves_on_fill_and_fails_on_fail():
    cache = BlockCache(8 * MiB)
    cache.watch((1, 0), "a", 100)
    ready = cache.pending((1, 0))
    assert ready is not None and not ready.done()
    loaded(cache, (1, 0), 100)
    assert ready.result(0) == []
    cache.watch((1, 200), "a", 100)
    failing = cache.pending((1, 200))
    cache.fail((1, 200), OSError("boom"))
    with pytest.raises(OSError):
        failing.result(0)
    assert cache.pending((1, 200)) is None
    assert cache.used_bytes == 100 and cache.watcher_count == 1


def test_prefetch_needs_watchers_and_stays_within_bytes_per_watcher():
    cache = BlockCache(64 * MiB, max_bytes_per_watcher=2 * MiB)
    assert cache.prefetch((1, 0), 100) is False  # nobody reads: no room at all
    cache.watch((9, 0), "reader", 512 * KiB)
    assert cache.speculative_room() == 2 * MiB - 512 * KiB
    assert cache.prefetch((1, 0), 1 * MiB) is True
    assert cache.prefetch((1, 1 * MiB), 1 * MiB) is False  # over the per-window share
    assert cache.prefetch((1, 1 * MiB), 512 * KiB) is True
    assert cache.used_bytes == 2 * MiB
    assert cache.speculative_bytes == 1536 * KiB and cache.prefetched_bytes == 1536 * KiB


def test_prefetch_respects_max_speculative_bytes_and_the_cache_budget():
    cache = BlockCache(4 * MiB, max_speculative_bytes=1 * MiB)
    for i in range(10):
        cache.watch((9, i), f"r{i}", 1)
    assert cache.prefetch((1, 0), 1 * MiB) is True
    assert cache.prefetch((1, 1 * MiB), 1) is False
    assert BlockCache(4 * MiB).max_speculative_bytes == 512 * KiB  # 1/8 of the cache


def test_prefetch_skips_blocks_present_or_already_read():
    cache = BlockCache(64 * MiB)
    cache.watch((1, 0), "a", 100)
    assert cache.prefetch((1, 0), 100) is False  # in flight for a reader
    loaded(cache, (1, 0), 100)
    cache.unwatch((1, 0), "a")  # read and freed: a ghost now
    cache.watch((9, 0), "b", 100)
    assert cache.prefetch((1, 0), 100) is False  # never re-fetch what was consumed
    assert cache.prefetch((1, 100), 100) is True
    assert cache.prefetch((1, 100), 100) is False  # already registered


def test_watch_claims_a_speculative_block():
    cache = BlockCache(64 * MiB)
    cache.watch((9, 0), "a", 100)
    assert cache.prefetch((1, 0), 300) is True
    assert cache.watch((1, 0), "b", 300) is False  # in flight: wait, do not load
    assert cache.speculative_bytes == 0 and cache.prefetch_claimed_bytes == 300
    loaded(cache, (1, 0), 300)
    cache.unwatch((1, 0), "b")
    assert cache.get((1, 0)) is None
    assert cache.prefetch_wasted_bytes == 0


def test_unclaimed_speculative_blocks_expire_as_waste():
    clock = Clock()
    cache = BlockCache(64 * MiB, speculative_ttl_s=30, clock=clock)
    cache.watch((9, 0), "a", 100)
    cache.prefetch((1, 0), 300)
    cache.prefetch((1, 300), 300)
    loaded(cache, (1, 0), 300)  # (1, 300) stays in flight
    clock.now += 31
    cache.speculative_room()  # expiry runs on budget checks
    assert cache.get((1, 0)) is None
    assert cache.prefetch_wasted_bytes == 300
    assert cache.pending((1, 300)) is not None  # in flight: expires once loaded
    loaded(cache, (1, 300), 300)
    cache.speculative_room()
    assert cache.pending((1, 300)) is None and cache.prefetch_wasted_bytes == 600
    assert cache.speculative_bytes == 0 and cache.used_bytes == 100


def test_byte_budget_drops_unclaimed_speculative_blocks_before_lru_blocks():
    cache = BlockCache(1000, max_speculative_bytes=1000, max_bytes_per_watcher=1000)
    cache.keep_unwatched((5, 0), [], 300)  # an LRU block
    cache.watch((9, 0), "a", 100)
    cache.prefetch((1, 0), 300)
    loaded(cache, (1, 0), 300)
    assert cache.used_bytes == 700
    cache.watch((9, 100), "a", 600)  # needs room: the speculative one goes
    assert cache.get((1, 0)) is None and cache.prefetch_wasted_bytes == 300
    assert cache.get((5, 0)) == [] and cache.used_bytes == 1000


def test_ghost_keys_are_bounded():
    cache = BlockCache(64 * MiB, max_ghosts=2)
    for pos in range(3):
        cache.watch((1, pos), "a", 10)
        loaded(cache, (1, pos), 10)
        cache.unwatch((1, pos), "a")
    cache.watch((9, 0), "b", 10)
    assert cache.prefetch((1, 0), 10) is True  # forgotten: the oldest ghost
    assert cache.prefetch((1, 2), 10) is False


def test_invalid_limits_are_refused():
    with pytest.raises(ValueError):
        BlockCache(0)
    with pytest.raises(ValueError):
        BlockCache(10, speculative_ttl_s=0)


def test_read_lately_means_wanted_or_consumed_not_prefetched():
    cache = BlockCache(64 * MiB)
    assert not cache.read_lately((1, 0))
    cache.watch((1, 0), "a", 10)
    assert cache.read_lately((1, 0))  # being read
    loaded(cache, (1, 0), 10)
    cache.unwatch((1, 0), "a")
    assert cache.read_lately((1, 0))  # read (a ghost)
    cache.watch((9, 0), "b", 10)
    cache.prefetch((1, 10), 10)
    assert not cache.read_lately((1, 10))  # only prefetched


def test_a_block_parked_unwatched_does_not_pin_the_get_it_was_decoded_from():
    """Batches decoded from a GET are views of its whole body; a block nobody watches any
    more (kept in the LRU, possibly for long) gets payloads of its own, so the cache's bytes
    are what it counts, not every GET one of its blocks came from."""
    from dataplane.formats.stream_records import StreamRecordBatch

    body = StreamRecordBatch(1, 0, 0, 1, b"x" * 4096).encode() + b"other blocks" * 1000
    batch, _ = StreamRecordBatch.decode(body, 0, share_payload=True)
    assert batch.payload.obj is body
    cache = BlockCache(8 * MiB)
    cache.watch((1, 0), "a", 4200)
    cache.unwatch((1, 0), "a")  # the reader gave up while the GET was in flight
    cache.fill((1, 0), [batch], 4200)
    (kept,) = cache.get((1, 0))
    assert type(kept.payload) is bytes and kept == batch
    cache.keep_unwatched((2, 0), [batch], 4200)
    (kept,) = cache.get((2, 0))
    assert type(kept.payload) is bytes and kept == batch
    cache.watch((3, 0), "a", 4200)  # watched: the view is kept (no copy)
    cache.fill((3, 0), [batch], 4200)
    assert cache.get((3, 0))[0] is batch
