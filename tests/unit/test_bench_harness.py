"""The benchmark harness's own promises: CPU hogs never outlive their block, the disk
latency baseline leaves nothing behind, medians take only figures, processes are told
apart by program."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._harness import (
    CpuSampler,
    TimelineSample,
    broker_second,
    cpu_hogs,
    cpu_s,
    disk_fdatasync_latency_ms,
    loopback_copy_cpu_s_per_gb,
    medians,
    process_kind,
    steady_window,
    threads_second,
    timeline_beside_perf,
    tree_cpu_s,
)
from cli.top_metrics import parse_prometheus_text


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child not yet reaped is a zombie: gone for our purpose
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_cpu_hogs_are_stopped_even_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError), cpu_hogs(2) as pids:
        assert len(pids) == 2 and all(alive(p) for p in pids)
        raise RuntimeError("the benchmark failed")
    assert not any(alive(p) for p in pids)


def test_disk_latency_baseline_reports_ordered_percentiles_and_removes_its_file(
    tmp_path: Path,
) -> None:
    figures = disk_fdatasync_latency_ms(tmp_path, byte_rate=4e6, seconds=0.3, block_bytes=4096)
    assert figures["writes"] > 10
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"]
    assert list(tmp_path.iterdir()) == []


def test_medians_take_numbers_present_in_every_round() -> None:
    rounds = [
        {"mb_s": 1.0, "flag": True, "rtt_ms": None, "name": "a", "n": 3},
        {"mb_s": 3.0, "flag": False, "rtt_ms": 4.0, "name": "b", "n": 5},
        {"mb_s": 2.0, "flag": True, "rtt_ms": 5.0, "name": "c", "n": 4},
    ]
    assert medians(rounds) == {"mb_s": 2.0, "n": 4}
    assert medians([]) == {}


def test_processes_are_told_apart_by_program_not_by_directory() -> None:
    cluster = "/tmp/broker-limits-x/cluster"
    assert process_kind(f"/usr/bin/weed server -dir {cluster}/s3") == "seaweedfs"
    assert process_kind(f"python -m dataplane.broker --config {cluster}/b.json") == "broker"
    assert (
        process_kind(f"python -m controlplane.server --dir {cluster}/controller-1") == "controllers"
    )
    assert process_kind(f"python -m something.else --dir {cluster}") == "other"


def _sample(at_s: float, page: str, cpu_s: float, threads: dict) -> TimelineSample:
    return TimelineSample(
        at_s, parse_prometheus_text(page), cpu_s, (at_s * 100, at_s * 200), threads, 0, {}
    )


def test_a_broker_second_is_the_difference_of_two_samples() -> None:
    """Loop lag, GC by generation, WAL appends, uploads and the WAL's trim come from the
    counters' and histograms' differences between two samples; the max is the highest
    bucket that counted anything."""
    before = _sample(
        100.0,
        'automq_event_loop_lag_seconds_bucket{le="0.001"} 10\n'
        'automq_event_loop_lag_seconds_bucket{le="0.05"} 10\n'
        'automq_event_loop_lag_seconds_bucket{le="+Inf"} 10\n'
        'automq_gc_pause_seconds_count{generation="2"} 1\n'
        'automq_gc_pause_seconds_sum{generation="2"} 0.01\n'
        "automq_stream_uploads_total 3\n"
        "automq_wal_used_bytes 50000000\n",
        1.0,
        {},
    )
    after = _sample(
        101.0,
        'automq_event_loop_lag_seconds_bucket{le="0.001"} 58\n'
        'automq_event_loop_lag_seconds_bucket{le="0.05"} 60\n'
        'automq_event_loop_lag_seconds_bucket{le="+Inf"} 60\n'
        'automq_gc_pause_seconds_count{generation="2"} 2\n'
        'automq_gc_pause_seconds_sum{generation="2"} 0.04\n'
        "automq_stream_uploads_total 4\n"
        "automq_wal_used_bytes 10000000\n",
        1.25,
        {},
    )
    row = broker_second(before, after)
    assert row["loop_lag_max_ms"] == 50.0 and row["loop_lag_p99_ms"] > 1.0
    assert row["gc_collections"] == {"2": 1} and row["gc_ms"] == {"2": 30.0}
    assert row["uploads"] == 1 and row["wal_used_mb_change"] == -40.0
    assert row["broker_cpu_share"] == 0.25 and row["machine_busy_share"] == 0.5


def test_thread_seconds_name_the_loop_and_the_busiest_threads() -> None:
    names = {1: "kafka-server-127.0.0.1", 2: "file-wal-committer-wal", 3: "uploader"}
    before = {1: (0, 0), 2: (0, 0), 3: (0, 0)}
    after = {1: (200_000_000, 50_000_000), 2: (40_000_000, 0), 3: (90_000_000, 1_000_000)}
    row = threads_second(before, after, names)
    assert row["loop_thread_run_ms"] == 200.0 and row["loop_thread_runqueue_ms"] == 50.0
    assert row["wal_thread_run_ms"] == 40.0 and row["uploader_thread_runqueue_ms"] == 1.0
    assert list(row["busiest_threads_ms"]) == ["kafka-server-127.0.0.1", "uploader", names[2]]


def test_perf_seconds_are_matched_with_the_nearest_broker_second() -> None:
    intervals = [
        {"t_s": 1.0, "produce_p99_ms": 3.0, "broker_rtt_p99_ms": 2.0, "end_unix_s": 10.0},
        {"t_s": 2.0, "produce_p99_ms": 40.0, "broker_rtt_p99_ms": 30.0, "end_unix_s": 11.0},
        {"t_s": 3.0, "produce_p99_ms": None, "end_unix_s": 15.0},
    ]
    timeline = [{"end_unix_s": 10.1, "uploads": 0}, {"end_unix_s": 11.05, "uploads": 1}]
    rows = timeline_beside_perf(intervals, timeline)
    assert [r.get("uploads") for r in rows] == [0, 1, None]  # none near the third second
    assert rows[1]["produce_p99_ms"] == 40.0 and rows[1]["broker_offset_s"] == 0.05


def test_the_steady_window_leaves_out_the_warm_up_and_the_last_interval() -> None:
    rows = [
        {"t_s": float(t), "end_unix_s": 1000.0 + t, "produce_mb_s": 100.0 if t > 3 else 40.0}
        for t in range(1, 9)
    ]
    start, end, gb = steady_window(rows, after_s=3)
    # intervals ending at 4..7 s (the one ending at 8 s may hold the end of the sends)
    assert (start, end) == (1003.0, 1007.0)
    assert gb == pytest.approx(0.4)
    assert steady_window(rows, after_s=7) is None  # too short to say anything


def test_cpu_samples_are_interpolated_between_their_times() -> None:
    sampler = CpuSampler(Path("/nonexistent"), root_pid=0)
    sampler.samples = [(10.0, {"broker": 1.0}), (12.0, {"broker": 3.0, "seaweedfs": 2.0})]
    assert sampler.between(10.5, 11.5) == pytest.approx({"broker": 1.0, "seaweedfs": 1.0})
    with pytest.raises(ValueError):
        sampler.at(13.0)


def test_a_process_trees_cpu_counts_its_live_descendants() -> None:
    """perf's workers are its children: their CPU counts to the load generator while
    they run."""
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    child = subprocess.Popen(
        [sys.executable, "-c", busy + "print(1, flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline()  # its 0.3 s are spent
        child_cpu = cpu_s(child.pid)
        assert child_cpu >= 0.25
        assert tree_cpu_s(child.pid) == pytest.approx(child_cpu, abs=0.05)
        own = cpu_s(os.getpid())  # first: the tree's walk of /proc adds to it
        assert tree_cpu_s(os.getpid()) >= own + child_cpu - 0.05
    finally:
        child.kill()
        child.wait(10)


def test_the_loopback_floor_measures_both_ends_of_a_connection() -> None:
    floor = loopback_copy_cpu_s_per_gb(mib=64)
    assert set(floor) == {"loopback_recv_cpu_s_per_gb", "loopback_send_cpu_s_per_gb"}
    # the kernel copies every byte on each side: never free, never seconds per GB
    assert all(0 < v < 20 for v in floor.values())
