"""The compaction scheduler: a cluster component that runs the job on its schedule.

    python -m cli.compaction_scheduler --dir <cluster dir>

After each compaction run it runs the table topics' sync job (cli/table_jobs.py), so a
compaction schedule is also the tables' schedule. Reads `compaction/schedule.json` before
every run (so `compaction schedule` can change it), runs one job at a time (a run never overlaps the next) and exits when the schedule is gone
or on SIGTERM (`cluster down`, `compaction unschedule`).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cli import compaction_jobs as jobs
from cli import table_jobs
from cli.local_cluster import LocalCluster
from controlplane.signal_watcher import SignalWatcher

log = logging.getLogger("compaction-scheduler")


def run_schedule(
    cluster: LocalCluster,
    stop: threading.Event,
    run_job: Callable[..., tuple[dict, int]] = jobs.run_job,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] | None = None,
    sync_tables: Callable[..., tuple[dict, int]] | None = None,
) -> int:
    """Run the job every `every_s` of the schedule until it is removed or `stop` is set.

    The first run comes one interval after the start (a schedule is not a `run`); a run
    never overlaps another (the next is skipped while a job, scheduled or manual, runs); a
    failed run is logged and the schedule goes on. `run_job`, `clock` and `sleep` are
    seams for tests (default: the real job, the monotonic clock, `stop.wait`).
    `sync_tables` (the process passes `table_jobs.run_scheduled_sync`) runs after each
    compaction run: the table topics' sync job (nothing when no topic is a table topic)."""
    sleep = sleep or stop.wait
    first = jobs.load_schedule(cluster.dir)
    next_run = clock() + (first.every_s if first else 0)
    while not stop.is_set():
        sched = jobs.load_schedule(cluster.dir)
        if sched is None:
            log.info("no schedule: exiting")
            return 0
        if clock() >= next_run:
            next_run = clock() + sched.every_s
            try:
                config = cluster.load()
                if jobs.running_job(cluster.dir):
                    log.info("a compaction job is still running: this run is skipped")
                else:
                    result, code = run_job(cluster.dir, config, sched.master, trigger="schedule")
                    log.info("run finished (exit %d): %s", code, result)
                if sync_tables is not None:
                    result, code = sync_tables(cluster.dir, config, sched.master)
                    if result:
                        log.info("table sync finished (exit %d): %s", code, result)
            except Exception as exc:  # noqa: BLE001 - the schedule outlives one bad run
                log.warning("run failed: %s", exc)
        sleep(min(1.0, max(next_run - clock(), 0.05)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cluster = LocalCluster(Path(args.dir))
    return run_schedule(
        cluster, SignalWatcher.install().stop_event, sync_tables=table_jobs.run_scheduled_sync
    )


if __name__ == "__main__":
    raise SystemExit(main())
