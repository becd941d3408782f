"""The WAL factory: a WAL URI picks the implementation; callers see only the interfaces.

`open_wal(uri, node_id, node_epoch)` opens a node's own WAL for appends; `take_over_wal(uri,
node_id, failover_epoch)` reserves a failed node's WAL and returns a recovery handle (crash
failover). The engine (`storage.py`) and WAL failover (`failover.py`) depend on these and on
`WriteAheadLog` / `WALRecovery` only, so a second implementation (an object-storage WAL, the
zone router's RouterChannel) plugs in by its scheme without touching them.

Schemes: `file:///abs/path` is the local-file WAL (`FileWAL`), reachable by other brokers of
the same host (standing in for a multi-attach cloud disk).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from dataplane.s3stream.wal.base import RecoveredRecord, WALError, WriteAheadLog
from dataplane.s3stream.wal.file_wal import FileWAL, FileWALConfig, take_over


class WALRecovery(Protocol):
    """A failed node's WAL, reserved by the recovering node: read, trim what was uploaded."""

    def recover(self) -> Iterator[RecoveredRecord]: ...

    def trim(self, up_to_offset: int) -> None: ...

    def close(self) -> None: ...


class UnsupportedWALError(WALError):
    """The WAL URI names a scheme this build has no implementation for, or is malformed."""


def wal_uri_for_path(path: str | os.PathLike[str]) -> str:
    """The `file://` URI of a local WAL file (absolute, so other brokers can reach it)."""
    return Path(path).resolve().as_uri()


def _file_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        known = "file:///abs/path"
        raise UnsupportedWALError(f"unsupported WAL URI {uri!r}: expected {known}")
    if parsed.netloc not in ("", "localhost"):
        raise UnsupportedWALError(
            f"WAL URI {uri!r} names host {parsed.netloc!r}: a file:// WAL must be on this host"
        )
    path = Path(unquote(parsed.path))
    if not path.is_absolute():
        raise UnsupportedWALError(f"WAL URI {uri!r} must hold an absolute path")
    return path


def wal_exists(uri: str) -> bool:
    """Whether the WAL behind `uri` has been created (failover of a node that never wrote)."""
    return _file_path(uri).exists()


def open_wal(
    uri: str,
    node_id: int,
    node_epoch: int,
    *,
    capacity_bytes: int | None = None,
    config: FileWALConfig | None = None,
) -> WriteAheadLog:
    """Open (or create) the WAL at `uri` as owner (node_id, node_epoch)."""
    path = _file_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileWAL.open(path, node_id, node_epoch, capacity_bytes=capacity_bytes, config=config)


def take_over_wal(uri: str, node_id: int, failover_epoch: int) -> WALRecovery:
    """Reserve the WAL at `uri` for recovery by `node_id` with `failover_epoch`: from the
    moment this returns its previous owner can no longer acknowledge an append."""
    return take_over(_file_path(uri), node_id, failover_epoch)
