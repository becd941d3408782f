"""The metadata quorum: a pysyncobj Raft group replicating state-machine commands.

Settings follow what was measured on this kind of machine (DESIGN.md, "pysyncobj facts"):
`appendEntriesUseBatch=False` so a commit does not wait for the 100 ms heartbeat; shorter
election timeouts so a new leader is up within about a second; a per-cluster password
(pysyncobj speaks pickle: whoever reaches the port could run code) and loopback binding.
`RaftNode` carries fixes to pysyncobj's append path (raft_node.py). A watchdog rebuilds a
follower from the leader only when it stopped applying: it is behind the leader's commit
index with no progress for `stuck_after_s`, or its own tick thread keeps failing while its
applied index stands still. A node that is applying is never rebuilt.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pysyncobj import SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.syncobj import SyncObjException

from controlplane import journal
from controlplane.errors import ControllerError, ErrorCode
from controlplane.raft_node import RaftNode, tick_thread_ident
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine

log = logging.getLogger(__name__)
journal.install()  # a full disk is an error for the journal, never SIGBUS (journal.py)

# how long a read served as the leader waits for a new leader to apply what its predecessor
# committed (it takes one replication round after the election)
LEADER_READY_WAIT_S = 3.0


class ReplicatedMetadata(SyncObjConsumer):
    """The pysyncobj consumer: its serialized state is exactly the state machine."""

    def __init__(self, settings: ControllerSettings, on_change: Callable[[], None]):
        # set before SyncObjConsumer.__init__ so pysyncobj does not pickle them
        self._on_change = on_change
        super().__init__()
        self.machine = MetadataStateMachine(settings)

    @replicated
    def execute(self, command: str, body: dict, now_ms: int) -> dict:
        result = self.machine.execute(command, body, now_ms)
        self._on_change()
        return result

    def _deserialize(self, data: dict) -> None:  # a snapshot was loaded: wake readers
        super()._deserialize(data)
        self._on_change()


@dataclass
class RaftTimeouts:
    """Raft timing; the defaults give ~1 s failover without spurious elections on 2 cores."""

    raft_min_timeout_s: float = 0.4
    raft_max_timeout_s: float = 1.0
    append_entries_period_s: float = 0.08
    connection_retry_s: float = 1.0
    log_compaction_min_entries: int = 20_000
    log_compaction_min_time_s: int = 120


class _TickFailureCounter(logging.Handler):
    """Counts pysyncobj's 'failed _onTick' errors logged by one node's tick thread.

    pysyncobj logs through one module logger for every node of the process, so the thread
    that logged tells whose tick failed (counting all of them rebuilt healthy followers
    whenever another in-process node was broken).
    """

    def __init__(self, thread_ident: Callable[[], int | None]) -> None:
        super().__init__(level=logging.ERROR)
        self._thread_ident = thread_ident
        self.failures = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "failed _onTick" in record.getMessage() and record.thread == self._thread_ident():
            self.failures += 1


class MetadataQuorum:
    """One voter of the metadata quorum, with submit/read/wait and stuck-node recovery."""

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        data_dir: Path,
        password: str,
        settings: ControllerSettings,
        timeouts: RaftTimeouts | None = None,
        stuck_after_s: float = 15.0,
    ):
        self.self_address = self_address
        self.partner_addresses = list(partner_addresses)
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.settings = settings
        self.timeouts = timeouts or RaftTimeouts()
        self.stuck_after_s = stuck_after_s
        self._changed = threading.Condition()
        self._lock = threading.RLock()  # guards replacing self._syncobj on recovery
        self._tick_failures = _TickFailureCounter(lambda: tick_thread_ident(self._syncobj))
        logging.getLogger("pysyncobj.syncobj").addHandler(self._tick_failures)
        self.recoveries = 0
        self._stop = threading.Event()
        self._start_syncobj()
        self._watchdog = threading.Thread(target=self._watch, name="quorum-watchdog", daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------ lifecycle

    def _conf(self) -> SyncObjConf:
        t = self.timeouts
        host = self.self_address.rsplit(":", 1)[0]
        return SyncObjConf(
            password=self.password,
            bindAddress=self.self_address if host else None,
            appendEntriesUseBatch=False,
            raftMinTimeout=t.raft_min_timeout_s,
            raftMaxTimeout=t.raft_max_timeout_s,
            appendEntriesPeriod=t.append_entries_period_s,
            connectionRetryTime=t.connection_retry_s,
            journalFile=str(self.journal_path),
            fullDumpFile=str(self.data_dir / "raft.dump"),
            logCompactionMinEntries=t.log_compaction_min_entries,
            logCompactionMinTime=t.log_compaction_min_time_s,
            dynamicMembershipChange=False,
            commandsWaitLeader=True,
        )

    @property
    def journal_path(self) -> Path:
        return self.data_dir / "raft.journal"

    def persist_error(self) -> str | None:
        """Why this node cannot persist its log now (disk full), or None."""
        return journal.persist_error(str(self.journal_path))

    def _start_syncobj(self) -> None:
        self.state = ReplicatedMetadata(self.settings, self._notify)
        self._syncobj = RaftNode(
            self.self_address, self.partner_addresses, self._conf(), consumers=[self.state]
        )

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            try:
                self._syncobj.destroy_synchronous()
            except Exception:  # already destroyed
                pass
        logging.getLogger("pysyncobj.syncobj").removeHandler(self._tick_failures)

    # ------------------------------------------------------------ commands and reads

    @property
    def machine(self) -> MetadataStateMachine:
        return self.state.machine

    def is_leader(self) -> bool:
        return bool(self._syncobj._isLeader())

    def leader_term(self) -> int | None:
        """The Raft term this node leads, or None when it is not the leader. Terms only
        grow, so a change of term tells a new leadership from the same one (even when this
        node lost and regained leadership between two looks)."""
        if not self.is_leader():
            return None
        return int(self._syncobj._SyncObj__raftCurrentTerm)

    def leader_ready(self) -> bool:
        """Leader, and its term's first entry (the no-op Raft appends on election) is applied:
        every record committed before the election is in the image now. Until then a new
        leader's image can miss the last records the old leader acknowledged."""
        if not self.is_leader():
            return False
        noop_index = getattr(self._syncobj, "_SyncObj__noopIDx", None)
        return noop_index is not None and self._syncobj.getStatus()["last_applied"] >= noop_index

    def wait_leader_ready(self, timeout_s: float = LEADER_READY_WAIT_S) -> None:
        """Before a read served as the leader: wait (bounded) until `leader_ready` or this
        node is no longer the leader. Followers serve their local image without waiting."""
        deadline = time.monotonic() + timeout_s
        while self.is_leader() and not self.leader_ready() and time.monotonic() < deadline:
            time.sleep(0.005)

    def leader_address(self) -> str | None:
        leader = self._syncobj._getLeader()
        return None if leader is None else str(getattr(leader, "address", leader))

    def raft_status(self) -> dict:
        s = self._syncobj.getStatus()
        return {
            "self": str(s["self"].address if hasattr(s["self"], "address") else s["self"]),
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(s["state"], str(s["state"])),
            "leader": self.leader_address(),
            "term": s["raft_term"],
            "commit_index": s["commit_idx"],
            "last_applied": s["last_applied"],
            "leader_commit_index": s["leader_commit_idx"],
            "has_quorum": bool(s["has_quorum"]),
            "leader_ready": self.leader_ready(),
            "log_len": s["log_len"],
            "uptime_s": s["uptime"],
            "recoveries": self.recoveries,
            "duplicate_entries_skipped": self._syncobj.duplicate_entries_skipped,
            "next_index_regressions_prevented": self._syncobj.next_index_regressions_prevented,
        }

    def submit(
        self, command: str, body: dict, timeout_s: float = 5.0, now_ms: int | None = None
    ) -> dict:
        """Replicate one command and return its result ({"result"} or {"error"}).

        Raises ControllerError NOT_CONTROLLER / NO_LEADER / TIMEOUT when it could not commit;
        the command may or may not have been applied after a TIMEOUT (commands are written
        to be idempotent when retried).
        """
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        unpersisted = self.persist_error() if self.is_leader() else None
        if unpersisted is not None:
            raise ControllerError(
                ErrorCode.LOG_NOT_PERSISTED,
                f"controller {self.self_address} {unpersisted}: it refuses writes until "
                "its disk has room again",
            )
        try:
            return self.state.execute(command, body, now_ms, sync=True, timeout=timeout_s)
        except SyncObjException as exc:
            code = exc.errorCode
            if code == "timeout":
                raise ControllerError(
                    ErrorCode.TIMEOUT, f"command {command} not committed in {timeout_s}s"
                ) from None
            if code in ("notLeader", 1):
                raise ControllerError(
                    ErrorCode.NOT_CONTROLLER, "this node is not the leader"
                ) from None
            raise ControllerError(
                ErrorCode.NO_LEADER, f"command {command} failed: no leader ({code})"
            ) from None

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait_for_offset(self, after_offset: int, timeout_s: float) -> None:
        """Block until the log has a record past `after_offset`, or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.machine.next_offset - 1 <= after_offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return
                self._changed.wait(min(remaining, 0.5))

    # ------------------------------------------------------------ stuck-node watchdog

    def _watch(self) -> None:
        last_applied = -1
        since = time.monotonic()
        failures_seen = self._tick_failures.failures
        while not self._stop.wait(1.0):
            try:
                s = self._syncobj.getStatus()
            except Exception:
                continue
            now = time.monotonic()
            applied, leader_commit = s["last_applied"], s["leader_commit_idx"]
            behind = leader_commit is not None and leader_commit > applied
            applying = applied != last_applied
            if applying or not behind:
                since = now
            last_applied = applied
            new_failures = self._tick_failures.failures - failures_seen
            failures_seen = self._tick_failures.failures
            if self.persist_error() is not None:
                new_failures = 0  # ticks fail because the disk is full: a rebuild cannot help
            is_follower = s["state"] == 0
            stuck = is_follower and behind and now - since > self.stuck_after_s
            # a broken tick thread never learns the leader's commit index, so "behind" cannot
            # show it: its own failures while nothing is applied do
            ticks_broken = is_follower and new_failures >= 10 and not applying
            if stuck or ticks_broken:
                log.error(
                    "raft node %s is stuck (applied=%s leader_commit=%s, tick failures=%d):"
                    " rebuilding it from the leader",
                    self.self_address,
                    applied,
                    leader_commit,
                    new_failures,
                )
                self._recover()
                last_applied, since = -1, time.monotonic()

    def _recover(self) -> None:
        """Drop this node's journal and snapshot and rejoin empty: the leader resends the log
        (or its snapshot). Safe because the node is a voter whose entries a majority has."""
        with self._lock:
            try:
                self._syncobj.destroy_synchronous()
            except Exception:
                log.exception("destroying the stuck raft node failed")
            stamp = int(time.time())
            for path in list(self.data_dir.glob("raft.journal*")) + list(
                self.data_dir.glob("raft.dump*")
            ):
                if ".stuck-" not in path.name:
                    shutil.move(str(path), str(path.with_name(f"{path.name}.stuck-{stamp}")))
            self.recoveries += 1
            self._start_syncobj()
        self._notify()
