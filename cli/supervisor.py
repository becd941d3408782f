"""The supervisor of a `cluster up` cluster (the default; `--no-supervise` opts out):
restarts crashed processes.

    python -m cli.supervisor --dir <cluster dir>

Every second it looks at the cluster's components (embedded stores, controllers, brokers);
one that is not running and was not stopped on purpose (`broker stop`, `controller stop`,
`cluster down` hold it down: cli/local_cluster.py `held`; `broker kill` and `controller
kill` are crashes, restarted like any other) is started again with
the CLI's own start code, after a backoff that doubles from 1 s to 30 s while it keeps
dying and resets once it stayed up a minute. Each restart is a log line
(DIR/logs/supervisor.log) and an entry of DIR/supervisor.json, which `cluster status`
shows. It exits on SIGTERM (`cluster down` stops it first). One supervisor per directory: a
second one exits at once (an flock on pids/supervisor.run.lock); a start of a component takes
that component's start lock (LocalCluster.start_lock), so the supervisor and `cluster up` or
`broker start` never start one twice. It runs in its own session, so no component's death
or signal reaches it; `cluster status` names a supervisor that is gone and `cluster up`
starts it again.

Why not supervisord (PyPI): it would own the processes, so the CLI's PID files, command-line
process discovery, `broker kill/start` and `cluster down` would all go through
supervisorctl and its own config; this loop reuses the CLI's start code and adds ~150
lines.

Thread-safety: one thread (the loop); the state file is replaced atomically.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.cluster_config import STORE_COMPONENTS, ClusterConfig, ClusterError
from cli.local_cluster import LocalCluster
from controlplane.signal_watcher import SignalWatcher

log = logging.getLogger("supervisor")

STATE_FILE = "supervisor.json"
CHECK_INTERVAL_S = 1.0
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0  # up this long: the next crash starts the backoff over
RUN_LOCK_FILE = "supervisor.run.lock"  # under DIR/pids: held while a supervisor runs


@dataclass
class Restarts:
    """One component's restarts by the supervisor."""

    restarts: int = 0
    last_restart_ms: int | None = None
    last_error: str | None = None  # the last restart that failed, None once one worked
    backoff_s: float = 0.0
    down_since_s: float | None = None  # monotonic; None while it runs
    up_since_s: float | None = None  # monotonic


def read_state(cluster_dir: Path) -> dict:
    """DIR/supervisor.json ({component: restarts}; {} when absent or unreadable)."""
    try:
        return json.loads((cluster_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


class Supervisor:
    """Restarts the components of one cluster that died (see the module docstring)."""

    def __init__(self, cluster: LocalCluster, clock=time.monotonic) -> None:
        self.cluster = cluster
        self._clock = clock
        self._state: dict[str, Restarts] = {}

    def _start(self, config: ClusterConfig, name: str) -> None:
        if self.cluster.held(name):  # stopped on purpose since this round looked
            return
        if name in STORE_COMPONENTS:
            self.cluster.start_object_stores(config, [name], timeout_s=30)
        elif name.startswith("controller-"):
            self.cluster.start_controller(config, int(name.split("-", 1)[1]))
        else:
            self.cluster.start_broker(config, int(name.split("-", 1)[1]))

    def check_once(self) -> list[str]:
        """One round: restart what is due; the names restarted."""
        config = self.cluster.load()
        running = self.cluster.running_pids(config)
        now = self._clock()
        restarted = []
        for name in self.cluster.supervised_names(config):
            st = self._state.setdefault(name, Restarts())
            if name in running:
                st.down_since_s = None
                if st.up_since_s is None:
                    st.up_since_s = now
                if now - st.up_since_s >= STABLE_AFTER_S:
                    st.backoff_s = 0.0
                continue
            if self.cluster.held(name):
                st.down_since_s = st.up_since_s = None  # stopped on purpose
                continue
            if st.down_since_s is None:
                st.down_since_s = now
                st.up_since_s = None
                log.warning("%s is not running (crashed?): restart in %.0f s", name, st.backoff_s)
            if now - st.down_since_s < st.backoff_s:
                continue
            st.restarts += 1
            st.last_restart_ms = int(time.time() * 1000)
            st.backoff_s = min(max(st.backoff_s * 2, FIRST_BACKOFF_S), MAX_BACKOFF_S)
            st.down_since_s = now  # the next attempt waits the backoff from this one
            try:
                self._start(config, name)
                st.last_error = None
                log.warning(
                    "restarted %s (restart %d; next backoff %.0f s)",
                    name,
                    st.restarts,
                    st.backoff_s,
                )
                restarted.append(name)
            except (ClusterError, OSError, RuntimeError) as exc:
                st.last_error = str(exc)[:500]
                log.error("restart %d of %s failed: %s", st.restarts, name, exc)
        self._save()
        return restarted

    def _save(self) -> None:
        data = {
            n: {k: v for k, v in asdict(s).items() if not k.endswith("_since_s")}
            for n, s in self._state.items()
        }
        path = self.cluster.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data, indent=2))
            os.replace(tmp, path)
        except OSError as exc:  # a full disk: the log line said it already
            log.debug("cannot write %s: %s", path, exc)

    def run(self, stop: threading.Event) -> int:
        """Check every CHECK_INTERVAL_S until `stop`; errors of a round are logged."""
        log.info("supervising %s", self.cluster.dir)
        while not stop.wait(CHECK_INTERVAL_S):
            _reap_children()
            try:
                self.check_once()
            except Exception as exc:  # noqa: BLE001 - the supervisor outlives one bad round
                log.error("supervision round failed: %s", exc)
        log.info("stopped")
        return 0


def _reap_children() -> None:
    """Collect the exit status of components this process started that have died, so
    they do not stay zombies (no Popen object of ours waits for them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def acquire_run_lock(cluster_dir: Path) -> int | None:
    """The fd holding DIR/pids/supervisor.run.lock (kept open while the supervisor runs),
    or None when another supervisor of this directory holds it."""
    path = cluster_dir / "pids" / RUN_LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def main(argv: list[str] | None = None) -> int:
    """`python -m cli.supervisor --dir DIR`: supervise until SIGTERM; exits at once when
    another supervisor runs for DIR."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cluster = LocalCluster(args.dir)
    lock_fd = acquire_run_lock(cluster.dir)
    if lock_fd is None:
        log.warning("another supervisor runs for %s: exiting", cluster.dir)
        return 0
    try:
        return Supervisor(cluster).run(SignalWatcher.install().stop_event)
    finally:
        os.close(lock_fd)


if __name__ == "__main__":
    raise SystemExit(main())
