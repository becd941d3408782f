"""The controllers' Raft journal: pysyncobj's file format, written with `pwrite` instead of
a memory map, so a full disk is an error, never a signal.

pysyncobj's `FileJournal` keeps its journal in a memory-mapped `ResizableFile`; growing the
map on a full tmpfs succeeds (the file is sparse) and the first store into a page the
filesystem cannot back kills the process with SIGBUS: a controller leader died that way
without a word (issue 33). This journal reads and writes the same file format (header,
then `size | idx term command | size` records; existing journals open unchanged) and:

- writes a record to the file *before* it enters the in-memory log, so an entry a
  controller could not persist is never counted as persisted (ENOSPC raises
  `JournalFullError`, pysyncobj logs the failed tick and retries; a follower does not
  answer an append it could not store, so the leader resends it);
- remembers the failure (`persist_error`) until a write succeeds again, which
  `MetadataQuorum` turns into a clear refusal of new commands;
- stores the term/vote meta file as pysyncobj does (a temporary file renamed), its ENOSPC
  raised too (a vote is never sent for a term that is not durable), and the commit index
  once a second, retried while the disk is full (one WARNING per failure episode).

`install()` makes pysyncobj create this journal for every `journalFile` (a process-wide
hook, like raft_node.py's message filter: the library's own code stays unmodified).

Thread-safety: a journal is used by its node's tick thread; `persist_error` is a plain
attribute read by other threads (a str or None, replaced whole).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import weakref

import pysyncobj.syncobj
from pysyncobj.journal import (
    APP_NAME,
    APP_VERSION,
    FIRST_RECORD_OFFSET,
    JOURNAL_FORMAT_VERSION,
    LAST_RECORD_OFFSET_OFFSET,
    NAME_SIZE,
    VERSION_SIZE,
    Journal,
    MemoryJournal,
    MetaStorer,
)
from pysyncobj.pickle import to_bytes

log = logging.getLogger(__name__)

# free space on the journal's filesystem at which a journal that failed to persist is let
# try again (a record is a few KiB; the meta file a few hundred bytes)
RETRY_FREE_BYTES = 1024 * 1024

# journals by path, so a quorum can ask its own (weak: a destroyed node's goes)
_OPEN: weakref.WeakValueDictionary[str, PwriteJournal] = weakref.WeakValueDictionary()


class JournalFullError(OSError):
    """The journal could not store a record or its meta data (ENOSPC, EDQUOT, EIO ...)."""


def _header() -> bytes:
    name = APP_NAME + b"\0" * (NAME_SIZE - len(APP_NAME))
    version = APP_VERSION + b"\0" * (VERSION_SIZE - len(APP_VERSION))
    return name + version + struct.pack("<II", JOURNAL_FORMAT_VERSION, FIRST_RECORD_OFFSET)


class PwriteJournal(Journal):
    """pysyncobj's Journal interface over its file format, with errors instead of SIGBUS."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.persist_error: str | None = None
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < FIRST_RECORD_OFFSET:
            self._pwrite(_header(), 0)
        self._entries: list[tuple[bytes, int, int]] = []
        end = struct.unpack("<I", os.pread(self._fd, 4, LAST_RECORD_OFFSET_OFFSET))[0]
        offset = FIRST_RECORD_OFFSET
        while offset < end:
            (size,) = struct.unpack("<I", os.pread(self._fd, 4, offset))
            data = os.pread(self._fd, size, offset + 4)
            idx, term = struct.unpack("<QQ", data[:16])
            self._entries.append((data[16:], idx, term))
            offset += size + 8
        self._offset = offset
        self._meta_storer = MetaStorer(path + ".meta")
        self._meta = self._meta_storer.getMeta()
        self._meta_saved = True
        _OPEN[path] = self

    # ------------------------------------------------------------ writing

    def _failed(self, what: str, exc: OSError) -> JournalFullError:
        first = self.persist_error is None
        self.persist_error = f"cannot persist the metadata log ({what}): {exc}"
        if first:
            log.warning("Raft journal %s: %s", self.path, self.persist_error)
        return JournalFullError(exc.errno or errno.EIO, self.persist_error)

    def _recovered(self) -> None:
        if self.persist_error is not None:
            log.warning("Raft journal %s: persisting again", self.path)
            self.persist_error = None

    def _pwrite(self, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.pwrite(self._fd, view, offset)
            except OSError as exc:
                raise self._failed("write", exc) from exc
            if written == 0:
                raise self._failed("write", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
            view, offset = view[written:], offset + written

    def _set_end(self, offset: int) -> None:
        self._pwrite(struct.pack("<I", offset), LAST_RECORD_OFFSET_OFFSET)

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Store the entry, then keep it in memory (JournalFullError: neither happened)."""
        data = struct.pack("<QQ", idx, term) + to_bytes(command)
        size = struct.pack("<I", len(data))
        record = size + data + size
        self._pwrite(record, self._offset)
        self._set_end(self._offset + len(record))
        self._offset += len(record)
        self._entries.append((command, idx, term))
        self._recovered()

    def clear(self) -> None:
        self._set_end(FIRST_RECORD_OFFSET)
        self._entries = []
        self._offset = FIRST_RECORD_OFFSET

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        kept = self._entries[:entryFrom]
        offset = self._offset
        for _ in range(len(self._entries) - len(kept)):
            (size,) = struct.unpack("<I", os.pread(self._fd, 4, offset - 4))
            offset -= size + 8
        self._set_end(offset)
        self._entries, self._offset = kept, offset

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802 (pysyncobj's name)
        kept = self._entries[entryTo:]
        self.clear()
        for entry in kept:
            self.add(*entry)

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        _OPEN.pop(self.path, None)
        os.close(self._fd)

    def flush(self) -> None:
        """Durable on disk (pysyncobj's journal flushes only when destroyed)."""
        os.fsync(self._fd)

    # ------------------------------------------------------------ meta

    def _store_meta(self) -> None:
        try:
            self._meta_storer.storeMeta(self._meta)
        except OSError as exc:
            raise self._failed("term, vote and commit index", exc) from exc
        self._meta_saved = True
        self._recovered()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802,N803
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self._meta.get("raftCommitIndex", 1)

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:  # noqa: N802,N803
        """Durable before pysyncobj sends anything that reflects it (Raft's rule)."""
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._meta.get("currentTerm", 0)

    def getVotedForNodeId(self):  # noqa: N802
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_saved:
            return
        try:
            self._store_meta()
        except JournalFullError:
            pass  # kept unsaved: retried next second; persist_error says why


def create_journal(journalFile: str | None = None) -> Journal:  # noqa: N803 (pysyncobj's)
    """pysyncobj's `createJournal` with this journal for files."""
    return MemoryJournal() if journalFile is None else PwriteJournal(journalFile)


def persist_error(path: str) -> str | None:
    """The open journal at `path`'s current failure to persist (None: none, not open, or
    its filesystem has room again: the next write tries, and fails anew if it must)."""
    journal = _OPEN.get(path)
    if journal is None or journal.persist_error is None:
        return None
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return journal.persist_error
    if st.f_bavail * st.f_frsize >= RETRY_FREE_BYTES:
        return None
    return journal.persist_error


def install() -> None:
    """Make pysyncobj create `PwriteJournal`s (idempotent, process-wide)."""
    pysyncobj.syncobj.createJournal = create_journal
