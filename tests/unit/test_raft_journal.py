"""The controllers' Raft journal (controlplane/journal.py): pysyncobj's file format written
with pwrite, so a full disk is an error and a refusal, never SIGBUS (issue 33 item 2)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from controlplane.errors import ControllerError, ErrorCode
from controlplane.journal import JournalFullError, PwriteJournal, persist_error
from controlplane.quorum import MetadataQuorum
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import find_free_ports


def test_it_reads_and_writes_pysyncobjs_format(tmp_path: Path) -> None:
    path = str(tmp_path / "raft.journal")
    theirs = FileJournal(path)
    for i in range(1, 6):
        theirs.add(b"cmd-%d" % i, i, 1)
    theirs.setCurrentTerm(3, None)
    theirs._destroy()
    ours = PwriteJournal(path)
    assert [e[1] for e in ours] == [1, 2, 3, 4, 5] and ours[4][0] == b"cmd-5"
    assert ours.getCurrentTerm() == 3
    ours.deleteEntriesFrom(3)
    ours.add(b"new-4", 4, 2)
    ours.deleteEntriesTo(1)
    ours._destroy()
    again = FileJournal(path)
    assert [(e[0], e[1], e[2]) for e in again] == [
        (b"cmd-2", 2, 1),
        (b"cmd-3", 3, 1),
        (b"new-4", 4, 2),
    ]
    again._destroy()


def test_a_full_disk_is_an_error_that_changes_nothing_and_heals(tmp_path: Path, faults) -> None:
    small = faults.size_limited_dir(tmp_path / "small", 4)
    path = str(small / "raft.journal")
    journal = PwriteJournal(path)
    journal.add(b"first", 1, 1)
    faults.fill_disk(small)
    with pytest.raises(JournalFullError, match="No space left on device"):
        journal.add(b"x" * 65536, 2, 1)
    assert len(journal) == 1 and persist_error(path) is not None
    assert "cannot persist the metadata log" in journal.persist_error
    with pytest.raises(JournalFullError):
        journal.setCurrentTerm(2, "node")
    journal.setRaftCommitIndex(1)
    journal.onOneSecondTimer()  # retried later, not raised
    faults.free_disk()
    assert persist_error(path) is None  # room again: the next write is let through
    journal.add(b"x" * 65536, 2, 1)
    journal.setCurrentTerm(2, None)
    assert len(journal) == 2 and journal.persist_error is None
    journal._destroy()
    reopened = PwriteJournal(path)
    assert [e[1] for e in reopened] == [1, 2] and reopened.getCurrentTerm() == 2
    reopened._destroy()


def test_a_leader_on_a_full_disk_refuses_writes_clearly_and_resumes(tmp_path: Path, faults):
    small = faults.size_limited_dir(tmp_path / "ctl", 8)
    raft_port = find_free_ports(1)[0]
    quorum = MetadataQuorum(
        f"127.0.0.1:{raft_port}", [], small, "p" * 24, ControllerSettings(bucket_ids=[0])
    )
    try:
        deadline = time.monotonic() + 20
        while not quorum.leader_ready():
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.05)
        body = {"name": "t1", "partitions": 1}
        quorum.submit("create_topic", body)
        faults.fill_disk(small)
        refused = None
        for i in range(50):  # the first write that finds the disk full marks it
            try:
                quorum.submit("create_topic", {"name": f"x{i}", "partitions": 1}, timeout_s=1)
            except ControllerError as exc:
                refused = exc
                if exc.code == ErrorCode.LOG_NOT_PERSISTED:
                    break
        assert refused is not None and refused.code == ErrorCode.LOG_NOT_PERSISTED, refused
        assert "refuses writes until its disk has room again" in str(refused)
        faults.free_disk()
        before = quorum.raft_status()["commit_index"]
        deadline = time.monotonic() + 10
        while True:
            try:
                quorum.submit("create_topic", {"name": "after", "partitions": 1}, timeout_s=2)
                break
            except ControllerError:
                assert time.monotonic() < deadline, "writes did not resume"
        assert quorum.raft_status()["commit_index"] > before  # committed again
    finally:
        quorum.close()
