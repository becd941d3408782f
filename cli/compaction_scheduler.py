"""The compaction scheduler: a cluster component that runs the job on its schedule.

    python -m cli.compaction_scheduler --dir <cluster dir>

Reads `compaction/schedule.json` before every run (so `compaction schedule` can change it),
runs one job at a time (a run never overlaps the next) and exits when the schedule is gone
or on SIGTERM (`cluster down`, `compaction unschedule`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time
from pathlib import Path

from cli import compaction_jobs as jobs
from cli.processes import ClusterError, LocalCluster

log = logging.getLogger("compaction-scheduler")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cluster = LocalCluster(Path(args.dir))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    first = jobs.load_schedule(cluster.dir)
    next_run = time.monotonic() + (first.every_s if first else 0)
    while not stop.is_set():
        sched = jobs.load_schedule(cluster.dir)
        if sched is None:
            log.info("no schedule: exiting")
            return 0
        if time.monotonic() >= next_run:
            next_run = time.monotonic() + sched.every_s
            try:
                config = cluster.load()
                if not jobs.running_job(cluster.dir):
                    result, code = jobs.run_job(
                        cluster.dir, config, sched.master, trigger="schedule"
                    )
                    log.info("run finished (exit %d): %s", code, result)
            except (ClusterError, OSError) as exc:
                log.warning("run failed: %s", exc)
        stop.wait(min(1.0, max(next_run - time.monotonic(), 0.05)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
