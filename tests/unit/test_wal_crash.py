"""FileWAL crash safety: a writer process is killed -9; every record it saw acknowledged is recovered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import FileWAL

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 64 * 1024 * 1024
CONFIG = FileWALConfig(
    max_record_bytes=64 * 1024, max_batch_bytes=256 * 1024, max_queue_bytes=1024 * 1024
)

# The child appends "<round>:<seq>:" + padding from 4 threads (each keeps a window of
# outstanding appends) and prints "ACK <round> <seq> <offset>" for every acknowledged one.
CHILD = (
    r"""
import sys, threading
from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import FileWAL, WALError
path, round_no, epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = FileWALConfig(max_record_bytes=64 * 1024, max_batch_bytes=256 * 1024, max_queue_bytes=1024 * 1024)
wal = FileWAL.open(path, 1, epoch, capacity_bytes=%d, config=config)
out_lock = threading.Lock()
def emit(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
emit("READY")
def worker(tid):
    pending = []
    for i in range(200000):
        seq = i * 4 + tid
        data = b"%%d:%%d:" %% (round_no, seq) + bytes(50 + (seq * 37) %% 900)
        try:
            pending.append((seq, wal.append(data)))
            if len(pending) >= 8:
                s, f = pending.pop(0)
                emit("ACK %%d %%d %%d" %% (round_no, s, f.result().offset))
        except WALError as exc:
            emit("STOP " + type(exc).__name__)
            return
threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
"""
    % CAPACITY
)


def _run_and_kill(path: Path, round_no: int, epoch: int, min_acks: int) -> list[tuple[int, int]]:
    """Start a writer, let it ack at least ``min_acks`` records, kill -9 it; return its acks."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(round_no), str(epoch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env=env,
        text=True,
    )
    acks: list[tuple[int, int]] = []
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    try:
        reader.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if sum(1 for line in list(lines) if line.startswith("ACK")) >= min_acks:
                break
            if proc.poll() is not None:
                raise AssertionError(f"writer exited early: {proc.stderr.read()}")
            time.sleep(0.01)
        else:
            raise AssertionError(f"writer acked too few records: {len(lines)} lines")
        # kill in the middle of the stream of group commits
        time.sleep(0.05 + (round_no % 3) * 0.03)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not any(line.startswith("STOP") for line in lines), lines[-5:]
    for line in lines:
        if line.startswith("ACK"):
            _, r, seq, offset = line.split()
            assert int(r) == round_no
            acks.append((int(seq), int(offset)))
    return acks


def test_acked_records_survive_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "crash.wal"
    all_acked: dict[int, tuple[int, bytes]] = {}  # offset -> (round, data prefix)
    epoch = 1
    for round_no in range(3):
        acks = _run_and_kill(path, round_no, epoch, min_acks=1500)
        assert len(acks) >= 1500
        for seq, offset in acks:
            all_acked[offset] = (round_no, b"%d:%d:" % (round_no, seq))
        epoch += 1
        with FileWAL.open(path, 1, epoch, config=CONFIG) as wal:  # recover in this process
            records = list(wal.recover())
            by_offset = {r.offset: r.data for r in records}
            # chain is contiguous and every record is well formed
            for prev, cur in zip(records, records[1:]):  # padding records between batches
                assert prev.next_offset <= cur.offset < prev.next_offset + 4096 + 24
            for r in records:
                rnd, seq, pad = r.data.split(b":", 2)
                assert len(pad) == 50 + (int(seq) * 37) % 900
            missing = [o for o in all_acked if o not in by_offset]
            assert not missing, (
                f"{len(missing)} acknowledged records lost, e.g. offset {missing[0]}"
            )
            for offset, (_, prefix) in all_acked.items():
                assert by_offset[offset].startswith(prefix)
            assert records[-1].next_offset <= wal.end_offset < records[-1].next_offset + 4096 + 24
        epoch += 1
