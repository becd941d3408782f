"""The broker's runtime (dataplane/runtime.py): the garbage-collector pause and event-loop lag
metrics, malloc keeping freed buffers."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time

import pytest
import uvloop
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from dataplane.runtime import (
    GC_PAUSE_SECONDS,
    PAUSE_BUCKETS_S,
    EventLoopLagProbe,
    install_gc_pause_metric,
    set_gil_switch_interval,
)


def _count(generation: str) -> float:
    for metric in GC_PAUSE_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels["generation"] == generation:
                return sample.value
    return 0.0


def test_every_full_collection_is_observed_once_even_if_installed_twice():
    install_gc_pause_metric()
    install_gc_pause_metric()
    before = _count("2")
    gc.collect()
    gc.collect()
    assert _count("2") == before + 2


def test_gc_pauses_are_exported_per_generation_with_sub_millisecond_buckets():
    install_gc_pause_metric()
    gc.collect(0)
    text = generate_latest(REGISTRY).decode()
    assert 'automq_gc_pause_seconds_bucket{generation="0",le="0.0005"}' in text
    assert 'automq_gc_pause_seconds_count{generation="0"}' in text


def _lag_histogram() -> Histogram:
    return Histogram("lag_seconds", "test", buckets=PAUSE_BUCKETS_S, registry=CollectorRegistry())


def _observed(histogram: Histogram) -> tuple[int, float, int]:
    """(samples, their sum in seconds, samples over 0.1 s)."""
    samples = [s for m in histogram.collect() for s in m.samples]
    value = {s.name: s.value for s in samples if "le" not in s.labels}
    at_most_100ms = next(s.value for s in samples if s.labels.get("le") == "0.1")
    count = int(value["lag_seconds_count"])
    return count, value["lag_seconds_sum"], count - int(at_most_100ms)


@pytest.mark.parametrize("new_loop", [uvloop.new_event_loop, asyncio.new_event_loop])
def test_a_blocked_event_loop_shows_as_lag(new_loop):
    """A callback that holds the loop for 200 ms: the probe's next sample is ~200 ms late
    (and samples go on after it)."""
    histogram = _lag_histogram()
    loop = new_loop()
    probe = EventLoopLagProbe(loop, interval_s=0.01, histogram=histogram)

    async def run() -> None:
        await asyncio.sleep(0.1)
        time.sleep(0.2)  # a long callback on the loop
        await asyncio.sleep(0.1)

    try:
        probe.start()
        loop.run_until_complete(run())
        probe.stop()
        loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        loop.close()
    count, total_s, over_100ms = _observed(histogram)
    assert over_100ms == 1, (count, total_s)
    assert total_s >= 0.15
    assert count >= 5  # samples before and after the stall


def test_a_stopped_probe_takes_no_more_samples():
    histogram = _lag_histogram()
    loop = asyncio.new_event_loop()
    probe = EventLoopLagProbe(loop, interval_s=0.005, histogram=histogram)
    try:
        probe.start()
        loop.run_until_complete(asyncio.sleep(0.05))
        probe.stop()
        loop.run_until_complete(asyncio.sleep(0.01))
        stopped_at = _observed(histogram)[0]
        loop.run_until_complete(asyncio.sleep(0.05))
    finally:
        loop.close()
    probe.stop()  # the loop is closed: a no-op
    assert stopped_at > 0 and _observed(histogram)[0] == stopped_at


_FAULTS_SCRIPT = """
import resource, sys
from dataplane.runtime import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    print("unsupported")
    raise SystemExit
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    body = b"x" * (8 << 20)
    del body
before = faults()
for _ in range(10):  # two GET bodies at once, freed after the answer is sent
    first, second = b"x" * (8 << 20), b"y" * (8 << 20)
    del first, second
print(faults() - before)
"""


def test_freed_get_sized_buffers_are_reused_without_page_faults():
    """8 MiB buffers (a GET body) freed and allocated again: by default glibc hands them back
    to the kernel and every page faults in again (~2,048 faults per buffer); with
    `keep_freed_memory` the process reuses them."""

    def faults(mode: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS_SCRIPT, mode],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.strip()

    kept = faults("keep")
    if kept == "unsupported":
        pytest.skip("not glibc")
    # 20 buffers of 2,048 pages each went through; only the second buffer's first use (and
    # a few stray pages) may fault
    assert int(kept) < 2 * 2048, f"default: {faults('default')} faults, kept: {kept}"


def test_the_gil_switch_interval_is_set_in_milliseconds():
    previous = sys.getswitchinterval()
    try:
        set_gil_switch_interval(0.5)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(previous)
