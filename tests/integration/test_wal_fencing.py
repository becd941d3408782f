"""Crash failover with the software reservation, across processes.

The old owner (a subprocess) appends from several threads and reports every
acknowledgement on stdout. The test pauses it with SIGSTOP, takes the WAL over
with a higher epoch (reservation durable before any read), recovers, and
resumes the old owner with SIGCONT. Every record the old owner ever reports as
acknowledged must be among the recovered records, and its next batch must fail
with WALFencedError.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dataplane.s3stream.wal import take_over

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
THREADS = 4

OWNER = (
    r"""
import collections, sys, threading, time
from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import FileWAL, WALFencedError, WALError
from dataplane.s3stream.wal import ring
path, write_delay_s = sys.argv[1], float(sys.argv[2])
if write_delay_s > 0:
    # a slow device: each group-commit write starts write_delay_s after the pre-write
    # ownership check, so SIGSTOP usually lands between that check and the write
    _write = ring.Ring.write_batch
    def slow_write(self, logical, parts, total):
        time.sleep(write_delay_s)
        _write(self, logical, parts, total)
    ring.Ring.write_batch = slow_write
config = FileWALConfig(max_record_bytes=16 * 1024, max_batch_bytes=1024 * 1024, max_queue_bytes=4 * 1024 * 1024)
wal = FileWAL.open(path, 1, 1, capacity_bytes=256 * 1024 * 1024, config=config)
lock = threading.Lock()
def emit(line):
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
emit("READY")
def worker(tid):
    pending = collections.deque()
    for i in range(1_000_000):
        try:
            pending.append((i, wal.append(b"t%%d-%%d:" %% (tid, i) + bytes(8000))))
            if len(pending) >= 16:
                seq, future = pending.popleft()
                emit("ACK %%d %%d %%d" %% (tid, seq, future.result(timeout=30).offset))
        except WALFencedError as exc:
            emit("FENCED %%d %%s" %% (tid, exc))
            return
        except WALError as exc:
            emit("ERROR %%d %%r" %% (tid, exc))
            return
threads = [threading.Thread(target=worker, args=(t,)) for t in range(%d)]
for t in threads: t.start()
for t in threads: t.join()
emit("DONE")
wal.close()
"""
    % THREADS
)


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    ("pause_after_acks", "write_delay_s"), [(300, 0.0), (2500, 0.0), (200, 0.02), (1000, 0.02)]
)
def test_old_owner_acks_nothing_after_takeover(
    tmp_path: Path, pause_after_acks: int, write_delay_s: float
) -> None:
    path = tmp_path / "owner.wal"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(path), str(write_delay_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=env,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:

        def acks() -> int:
            return sum(1 for line in list(lines) if line.startswith("ACK"))

        _wait_for(lambda: acks() >= pause_after_acks or proc.poll() is not None, 30, "acks")
        assert proc.poll() is None, proc.stderr.read()

        proc.send_signal(signal.SIGSTOP)
        _wait_for(lambda: _process_state(proc.pid) == "T", 10, "the owner to stop")
        reported_before_takeover = acks()

        with take_over(path, new_node_id=2, new_node_epoch=2) as recovery:
            # reservation is durable here; now read the WAL
            recovered = {r.offset: r.data for r in recovery.recover()}
            recovered_end = recovery.end_offset

        proc.send_signal(signal.SIGCONT)
        _wait_for(
            lambda: any(line.startswith("DONE") for line in list(lines)),
            30,
            "the owner to stop appending",
        )
        proc.wait(timeout=30)
        reader.join(timeout=10)

        fenced = [line for line in lines if line.startswith("FENCED")]
        errors = [line for line in lines if line.startswith("ERROR")]
        assert not errors, errors
        assert len(fenced) == THREADS, lines[-10:]
        assert "node 2 epoch 2" in fenced[0]

        ack_lines = [line.split() for line in lines if line.startswith("ACK")]
        assert len(ack_lines) >= reported_before_takeover >= pause_after_acks
        lost = []
        for _, tid, seq, offset in ack_lines:
            data = recovered.get(int(offset))
            if data is None or not data.startswith(b"t%s-%s:" % (tid.encode(), seq.encode())):
                lost.append((tid, seq, offset))
        assert not lost, (
            f"old owner acknowledged {len(lost)} records the recoverer did not see: {lost[:5]}"
        )
        assert all(int(offset) < recovered_end for _, _, _, offset in ack_lines)
        # per thread, acks are reported in append order with no gap
        for tid in range(THREADS):
            seqs = [int(s) for _, t, s, _ in ack_lines if int(t) == tid]
            assert seqs == list(range(len(seqs)))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
