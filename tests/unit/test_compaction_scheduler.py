"""The compaction scheduler's loop (issue #12): a schedule fires every interval, never
overlaps a running job, survives a failed run, exits when unscheduled, and
`automqctl compaction status` shows the scheduled runs.

The loop runs in process on a real cluster directory with a fake job runner and a fake
clock (the real job is Spark: tests/e2e/test_compaction.py), so the test takes no time.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from cli import compaction_jobs as jobs
from cli.compaction_scheduler import run_schedule
from cli.local_cluster import LocalCluster
from cli.main import app


class FakeTime:
    """A clock that `sleep` advances; stops the loop after `until_s`."""

    def __init__(self, stop: threading.Event, until_s: float) -> None:
        self.now_s = 0.0
        self.stop = stop
        self.until_s = until_s
        self.hooks: dict[float, Callable[[], object]] = {}  # at this time, call this (once)

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        assert 0 < seconds <= 1.0  # the loop re-reads the schedule at least every second
        self.now_s += seconds
        for at in sorted(self.hooks):
            if self.now_s >= at:
                self.hooks.pop(at)()
        if self.now_s >= self.until_s:
            self.stop.set()


@pytest.fixture
def cluster(tmp_path):
    cluster = LocalCluster(tmp_path / "c")
    cluster.create(1, 1, ["a"], None, None, 6000)
    return cluster


def schedule(cluster: LocalCluster, every_s: int, master: str = "local[2]") -> None:
    path = jobs.compaction_dir(cluster.dir) / "schedule.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jobs.Schedule(every_s=every_s, master=master).model_dump_json())


def fake_runner(calls: list, fake: FakeTime, fail_at: set[int] = frozenset()):
    def run_job(cluster_dir, config, master, trigger="manual"):
        calls.append((fake.now_s, master, trigger))
        if len(calls) in fail_at:
            raise RuntimeError("spark-submit exploded")
        result = {"committed": True, "objects_before": 40, "objects_after": 3, "master": master}
        jobs.append_run(cluster_dir, {"start": fake.now_s, "trigger": trigger, **result})
        return result, 0

    return run_job


def test_a_schedule_fires_every_interval_and_status_shows_the_runs(cluster):
    schedule(cluster, 10)
    stop = threading.Event()
    fake = FakeTime(stop, until_s=35)
    calls: list = []
    assert run_schedule(cluster, stop, fake_runner(calls, fake), fake.clock, fake.sleep) == 0
    # not at once: the first run one interval after the start, then every interval
    assert [round(t) for t, _, _ in calls] == [10, 20, 30]
    assert all(m == "local[2]" and trig == "schedule" for _, m, trig in calls)
    out = CliRunner().invoke(
        app, ["compaction", "status", "--dir", str(cluster.dir), "--format", "json"]
    )
    assert out.exit_code == 0, out.output
    status = json.loads(out.stdout)
    assert status["schedule"] == {"every_s": 10, "master": "local[2]"}
    runs = status["last_runs"]
    assert [r["trigger"] for r in runs] == ["schedule"] * 3
    assert all(r["committed"] and r["objects_after"] == 3 for r in runs)


def test_a_running_job_is_not_overlapped_and_a_failed_run_does_not_end_the_schedule(cluster):
    schedule(cluster, 10)
    stop = threading.Event()
    fake = FakeTime(stop, until_s=55)
    running = jobs.compaction_dir(cluster.dir) / "running.json"
    # a manual run (this live process) holds the slot from 5 s to 25 s
    fake.hooks[5] = lambda: running.write_text(json.dumps({"pid": os.getpid(), "started": 0}))
    fake.hooks[25] = lambda: running.unlink()
    calls: list = []
    run_schedule(cluster, stop, fake_runner(calls, fake, fail_at={1}), fake.clock, fake.sleep)
    # 10 and 20 skipped (a job was running); the run at 30 fails; 40 and 50 still come
    assert [round(t) for t, _, _ in calls] == [30, 40, 50]
    assert len(jobs.last_runs(cluster.dir)) == 2


def test_unschedule_ends_the_loop_and_a_new_interval_applies_at_the_next_run(cluster):
    schedule(cluster, 10)
    stop = threading.Event()
    fake = FakeTime(stop, until_s=1_000)  # only the unschedule ends it
    path = jobs.compaction_dir(cluster.dir) / "schedule.json"
    fake.hooks[12] = lambda: schedule(cluster, 30, "local[1]")
    fake.hooks[75] = lambda: path.unlink()
    calls: list = []
    assert run_schedule(cluster, stop, fake_runner(calls, fake), fake.clock, fake.sleep) == 0
    assert not stop.is_set() and fake.now_s < 80
    # the run due at 20 uses the new schedule, then every 30 s
    assert [(round(t), m) for t, m, _ in calls] == [
        (10, "local[2]"),
        (20, "local[1]"),
        (50, "local[1]"),
    ]
