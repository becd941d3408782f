"""The WAL factory picks the implementation by URI and refuses what it cannot open."""

from __future__ import annotations

import pytest

from dataplane.s3stream.wal import WALFencedError, WriteAheadLog
from dataplane.s3stream.wal.factory import (
    UnsupportedWALError,
    open_wal,
    take_over_wal,
    wal_exists,
    wal_uri_for_path,
)


def test_file_uri_opens_a_wal_that_recovers_and_can_be_taken_over(tmp_path):
    uri = wal_uri_for_path(tmp_path / "storage" / "wal")
    assert uri.startswith("file:///") and not wal_exists(uri)
    wal = open_wal(uri, 1, 0, capacity_bytes=16 << 20)
    assert isinstance(wal, WriteAheadLog)
    results = [wal.append(f"record-{i}".encode()).result(5) for i in range(3)]
    wal.close()
    assert wal_exists(uri)
    handle = take_over_wal(uri, 2, 1)
    try:
        assert [r.data for r in handle.recover()] == [b"record-0", b"record-1", b"record-2"]
        handle.trim(results[-1].next_offset)
    finally:
        handle.close()
    # the old owner is fenced by the reservation: it cannot open the WAL again
    with pytest.raises(WALFencedError):
        open_wal(uri, 1, 0).close()


@pytest.mark.parametrize(
    "uri", ["s3://bucket/wal", "file://otherhost/tmp/wal", "file:relative", "/no/scheme", ""]
)
def test_unsupported_or_malformed_uris_are_refused_clearly(uri, tmp_path):
    with pytest.raises(UnsupportedWALError) as exc:
        open_wal(uri, 1, 0, capacity_bytes=1 << 20)
    assert "WAL URI" in str(exc.value) or "unsupported" in str(exc.value)
