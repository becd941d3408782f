"""Write-ahead logs of the S3Stream engine.

``WriteAheadLog`` is the interface; ``FileWAL`` is the local-file (cloud disk)
implementation with group commit and a software reservation for crash
failover; ``take_over`` is the recoverer's side of that reservation.
"""

from dataplane.s3stream.wal.base import (
    AppendResult,
    RecoveredRecord,
    RoomSignal,
    WALBackpressureError,
    WALClosedError,
    WALCorruptError,
    WALError,
    WALFencedError,
    WALFullError,
    WALQueueFullError,
    WALQueueTimeoutError,
    WALTakeoverRefusedError,
    WriteAheadLog,
)
from dataplane.s3stream.wal.file_takeover import FileWALRecovery, take_over
from dataplane.s3stream.wal.file_wal import FileWAL

__all__ = [
    "AppendResult",
    "FileWAL",
    "FileWALRecovery",
    "RecoveredRecord",
    "RoomSignal",
    "WALBackpressureError",
    "WALClosedError",
    "WALCorruptError",
    "WALError",
    "WALFencedError",
    "WALFullError",
    "WALQueueFullError",
    "WALQueueTimeoutError",
    "WALTakeoverRefusedError",
    "WriteAheadLog",
    "take_over",
]
