"""pysyncobj's SyncObj with two Raft fixes carried by the project, and per-node tick health.

pysyncobj 0.3.17 breaks Raft's append rule in two places that meet under load:

1. **The leader moves `nextIndex` backwards.** With `appendEntriesUseBatch=False` the leader
   sends every new entry at once and advances `nextIndex` optimistically. A success reply
   for an older message (`next_node_idx` = N) then sets `nextIndex` back to N, so the next
   append re-sends entries the follower already holds.
2. **The follower truncates entries that do not conflict.** On any append whose
   `prevLogIdx` is not its last entry it deletes everything after `prevLogIdx`, although
   Raft deletes only from the first entry whose term differs. With (1) this truncated entries
   the follower had already applied (pysyncobj logs CRITICAL "truncating already-applied log
   entries") several times a second under produce load, rewrote the journal each time, and
   briefly left the follower's log shorter than its applied index.

Both are fixed here by filtering messages before pysyncobj's own handler sees them, so the
library's code stays unmodified: the leader keeps the larger `nextIndex`; the follower drops
the new entries it already holds with the same term, and an append that brings nothing new is
answered without touching the log when every entry past it was written by the same leader
term (the leader's log in its own term is append-only, so those entries are the leader's).

"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pysyncobj import SyncObj

log = logging.getLogger(__name__)


class RaftNode(SyncObj):
    """A SyncObj whose append path follows Raft (see the module docstring).

    Thread-safety: the message filter runs on pysyncobj's tick thread, like the handler it
    wraps; its counters are plain ints written by that thread only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # set before SyncObj.__init__ so pysyncobj counts them as properties, not state
        self.duplicate_entries_skipped = 0
        self.next_index_regressions_prevented = 0
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------ message filter

    def _SyncObj__onMessageReceived(self, node: Any, message: dict) -> None:  # noqa: N802
        kind = message.get("type")
        if kind == "next_node_idx":
            self._on_next_node_idx(node, message)
            return
        if kind == "append_entries":
            self._filter_append(message)
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]

    def _on_next_node_idx(self, node: Any, message: dict) -> None:
        next_index: dict = self._SyncObj__raftNextIndex  # type: ignore[attr-defined]
        before = next_index.get(node)
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
        after = next_index.get(node)
        # a success reply never lowers nextIndex (a reset = the follower asked for a resend)
        if (
            message.get("success")
            and not message.get("reset")
            and before is not None
            and after is not None
            and after < before
        ):
            next_index[node] = before
            self.next_index_regressions_prevented += 1

    def _filter_append(self, message: dict) -> None:
        """Rewrite an append (in place) so that it names only entries we do not hold yet."""
        if (
            "prevLogIdx" not in message
            or message.get("transmission") is not None
            or message["term"] < self._SyncObj__raftCurrentTerm
        ):  # type: ignore[attr-defined]
            return
        entries = message.get("entries") or []
        prev_idx: int = message["prevLogIdx"]
        held = self._SyncObj__getEntries(prev_idx)  # type: ignore[attr-defined]
        if not held or held[0][2] != message["prevLogTerm"] or len(held) == 1:
            return  # a mismatch (pysyncobj answers it) or nothing past prev: as is
        # skip the new entries that match what we hold (same index and term)
        skipped = 0
        for entry, mine in zip(entries, held[1:]):
            if entry[1] != mine[1] or entry[2] != mine[2]:
                break
            skipped += 1
        if skipped:
            self.duplicate_entries_skipped += skipped
            message["prevLogIdx"] = entries[skipped - 1][1]
            message["prevLogTerm"] = entries[skipped - 1][2]
            message["entries"] = entries[skipped:]
        rest = message["entries"] if skipped else entries
        if rest:
            return  # a conflict or new entries: pysyncobj truncates from there, as Raft does
        # nothing new: keep our tail if this leader's term wrote it all, else let pysyncobj
        # drop the unverified tail (entries of an older term past what the leader sent)
        verified_end = message["prevLogIdx"]
        tail = self._SyncObj__getEntries(verified_end + 1)  # type: ignore[attr-defined]
        if not tail or any(e[2] != message["term"] for e in tail):
            return
        message["prevLogIdx"] = tail[-1][1]
        message["prevLogTerm"] = tail[-1][2]


def tick_thread_ident(node: SyncObj) -> int | None:
    """The thread id of pysyncobj's tick thread of `node` (None before it started)."""
    thread = getattr(node, "_SyncObj__thread", None)
    return thread.ident if isinstance(thread, threading.Thread) else None
