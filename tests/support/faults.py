"""A failure injector for tests (in the style of Redpanda's rptest `FailureInjector`).

Every fault it makes is recorded and undone by `heal()`, which runs on leaving the context
(`with FailureInjector() as faults:`) or at the end of a test using the `faults` fixture
(tests/conftest.py),
whatever happened, so a failed test never leaves a paused process, a full disk, a mounted
tmpfs or a fault proxy behind:

- processes: `kill` (SIGKILL), `terminate` (SIGTERM, waits for the exit), `suspend` /
  `resume` (SIGSTOP / SIGCONT; every suspended process is resumed on heal), `suspended`
  (a context manager);
- object stores: `pause_object_stores` (SIGSTOP of a cluster's embedded SeaweedFS: every
  request to it hangs) and `store_proxy` (a TCP fault proxy in front of an S3 endpoint that
  resets, answers 503, blackholes or delays: tests/integration/fault_proxy.py);
- disks: `size_limited_dir` (a tmpfs of the given size mounted on a directory; skips the
  test with the reason when mounting is not permitted) and `fill_disk` (a filler file that
  takes the free space; removed on heal, or earlier with `free_disk`);
- the WAL: `corrupt_wal` overwrites bytes in the middle of a file WAL's valid records (not
  undone: a corruption is the point; the WAL file goes with the cluster).

Thread-safety: one injector per test, used from the test's thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fault_proxy import FaultProxy

FILL_CHUNK_BYTES = 1024 * 1024
MAX_FILL_BYTES = 64 * 1024**3  # a filler never writes more than this, whatever df says
TERMINATE_TIMEOUT_S = 30.0
MAX_SIZE_LIMITED_MIB = 4096


def _alive(pid: int) -> bool:
    """Is `pid` a live process (a zombie counts as gone)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _gone_within(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` until `pid` is gone; True if it is."""
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _signal(pid: int, sig: signal.Signals) -> bool:
    """Send `sig`; False if the process is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class FailureInjector:
    """Makes faults and undoes them all on `heal()` / exit (see the module docstring)."""

    def __init__(self) -> None:
        self._suspended: list[int] = []
        self._fillers: list[Path] = []
        self._mounts: list[Path] = []
        self._proxies: list[FaultProxy] = []

    def __enter__(self) -> FailureInjector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()

    # ------------------------------------------------------------ processes

    def kill(self, pid: int, timeout_s: float = TERMINATE_TIMEOUT_S) -> bool:
        """kill -9 `pid` and wait up to `timeout_s` until it is gone; True if it is (nothing
        to heal: whoever runs it restarts it). A suspended process dies as well."""
        _signal(pid, signal.SIGKILL)
        if pid in self._suspended:
            self._suspended.remove(pid)
        return _gone_within(pid, timeout_s)

    def terminate(self, pid: int, timeout_s: float = TERMINATE_TIMEOUT_S) -> bool:
        """SIGTERM `pid` and wait up to `timeout_s` for it to exit; True if it did."""
        if pid in self._suspended:
            self.resume(pid)  # a stopped process cannot act on SIGTERM
        _signal(pid, signal.SIGTERM)
        return _gone_within(pid, timeout_s)

    def suspend(self, *pids: int) -> None:
        """SIGSTOP each of `pids`; they are resumed on heal if not before."""
        for pid in pids:
            if _signal(pid, signal.SIGSTOP) and pid not in self._suspended:
                self._suspended.append(pid)

    def resume(self, *pids: int) -> None:
        """SIGCONT each of `pids`."""
        for pid in pids:
            _signal(pid, signal.SIGCONT)
            if pid in self._suspended:
                self._suspended.remove(pid)

    @contextlib.contextmanager
    def suspended(self, *pids: int) -> Iterator[None]:
        """`pids` stopped for the block's duration."""
        self.suspend(*pids)
        try:
            yield
        finally:
            self.resume(*pids)

    # ------------------------------------------------------------ object stores

    def pause_object_stores(self, up_status: dict) -> list[int]:
        """SIGSTOP every embedded store of a cluster (`up_status`: the status JSON of
        `cluster up` or `cluster status`); returns their pids (resume them with `resume`)."""
        pids = [s["pid"] for s in up_status.get("object_stores", []) if s.get("pid")]
        assert pids, f"no embedded object store runs: {up_status.get('object_stores')}"
        self.suspend(*pids)
        return pids

    def store_proxy(self, host: str, port: int) -> FaultProxy:
        """A fault proxy in front of an S3 endpoint; set its `mode` to "reset", "503",
        "blackhole" or "latency" (back to "pass" heals). Closed on heal."""
        proxy = FaultProxy(host, port)
        self._proxies.append(proxy)
        return proxy

    # ------------------------------------------------------------ disks

    def size_limited_dir(self, path: Path, size_mib: int) -> Path:
        """Mount a tmpfs of `size_mib` MiB on `path` (created if missing; it must be empty);
        unmounted on heal. Skips the test when mounting is not permitted (not root, no
        CAP_SYS_ADMIN)."""
        if not 0 < size_mib <= MAX_SIZE_LIMITED_MIB:
            raise ValueError(f"size_mib must be in 1..{MAX_SIZE_LIMITED_MIB}, got {size_mib}")
        path.mkdir(parents=True, exist_ok=True)
        if any(path.iterdir()):
            raise ValueError(f"{path} is not empty: a mount would hide its files")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {size_mib} MiB tmpfs on {path}: {done.stderr.strip()}")
        self._mounts.append(path)
        return path

    def fill_disk(self, directory: Path, leave_bytes: int = 0) -> Path:
        """Write a filler file in `directory` until its filesystem has at most `leave_bytes`
        free (or is full: ENOSPC); returns the filler (removed on heal or by `free_disk`)."""
        filler = directory / f".filler-{os.getpid()}-{len(self._fillers)}"
        self._fillers.append(filler)
        chunk = b"\0" * FILL_CHUNK_BYTES
        written = 0
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while written < MAX_FILL_BYTES:
                st = os.statvfs(directory)
                free = st.f_bavail * st.f_frsize
                if free <= leave_bytes:
                    break
                want = min(FILL_CHUNK_BYTES, free - leave_bytes)
                try:
                    written += os.write(fd, chunk[:want])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)
        return filler

    def free_disk(self, filler: Path | None = None) -> None:
        """Remove `filler` (None: every filler this injector wrote)."""
        for f in [filler] if filler is not None else list(self._fillers):
            f.unlink(missing_ok=True)
            if f in self._fillers:
                self._fillers.remove(f)

    # ------------------------------------------------------------ the WAL

    @staticmethod
    def wal_records_not_uploaded(wal_path: Path) -> int:
        """How many valid records a file WAL holds past its trim offset (read-only: safe
        while its broker runs; a record being written stops the count, as a torn end)."""
        from dataplane.s3stream.wal.ring import RecordScanner, Ring, read_meta, read_state

        fd = os.open(wal_path, os.O_RDONLY)
        try:
            state = read_state(fd)
            if state is None:
                return 0
            ring = Ring(fd, read_meta(fd).capacity_bytes)
            return sum(1 for _ in RecordScanner(ring, state.trim_offset))
        finally:
            os.close(fd)

    def corrupt_wal(self, wal_path: Path, min_records: int = 20) -> tuple[int, int]:
        """Overwrite 8 bytes in the body of the record in the middle of a file WAL's valid,
        not yet uploaded records; returns (that record's offset, records after it)."""
        from dataplane.s3stream.wal.format import DATA_START_BYTES, RECORD_HEADER_SIZE_BYTES
        from dataplane.s3stream.wal.ring import RecordScanner, Ring, read_meta, read_state

        fd = os.open(wal_path, os.O_RDWR)
        try:
            capacity = read_meta(fd).capacity_bytes
            state = read_state(fd)
            assert state is not None, f"{wal_path} has no state record"
            records = [
                (off, len(body))
                for off, body in RecordScanner(Ring(fd, capacity), state.trim_offset)
            ]
            assert len(records) >= min_records, (
                f"only {len(records)} records not uploaded: nothing to corrupt"
            )
            victim, body_bytes = records[len(records) // 2]
            # inside the victim's own body, however small (a Link Record is ~40 B): bytes
            # past it would break the next record's header instead, which reads as a torn end
            span = min(8, body_bytes)
            into = min(30, body_bytes - span)
            where = DATA_START_BYTES + (victim + RECORD_HEADER_SIZE_BYTES + into) % capacity
            os.pwrite(fd, bytes(b ^ 0xFF for b in os.pread(fd, span, where)), where)
            os.fsync(fd)
            return victim, len(records) - len(records) // 2 - 1
        finally:
            os.close(fd)

    # ------------------------------------------------------------ healing

    def heal(self) -> None:
        """Undo every fault still in place: resume suspended processes, close fault proxies,
        remove fillers, unmount size-limited directories (lazily if still in use)."""
        self.resume(*list(self._suspended))
        for proxy in self._proxies:
            proxy.close()
        self._proxies.clear()
        self.free_disk()
        for path in reversed(self._mounts):
            done = subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
            if done.returncode != 0:  # a process still has a file open there
                subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
        self._mounts.clear()
