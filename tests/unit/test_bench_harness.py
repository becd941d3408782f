"""The benchmark harness's own promises: CPU hogs never outlive their block, the disk
latency baseline leaves nothing behind, medians take only figures, processes are told
apart by program."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks._harness import cpu_hogs, disk_fdatasync_latency_ms, medians, process_kind


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
