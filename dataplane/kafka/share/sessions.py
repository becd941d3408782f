"""Share sessions (KIP-932's ShareSessionCache): what a member fetches from this broker.

A member opens a session with a ShareFetch at ShareSessionEpoch 0 (naming its partitions;
acknowledgements are not allowed then), continues it with epochs 1, 2, ... (each request
adds partitions and forgets some; an epoch other than the expected one is
INVALID_SHARE_SESSION_EPOCH, a request for a session the broker does not hold
SHARE_SESSION_NOT_FOUND) and closes it with epoch -1 (ShareFetch or ShareAcknowledge), after
which the records it still holds are released. At most `max_sessions` are kept: opening one
more evicts the least recently used.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from dataplane.formats.kafka_errors import KafkaError

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_PARTITIONS_PER_SESSION = 10_000

#: (topic id, partition)
SessionPartition = tuple[str, int]


@dataclass
class ShareSession:
    """One member's share session on this broker."""

    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    partitions: dict[SessionPartition, None] = field(default_factory=dict)  # ordered set
    last_used_s: float = field(default_factory=time.monotonic)


class SessionError(Exception):
    """A request that does not fit the session rules: its top-level Kafka error."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error


class ShareSessions:
    """The share sessions of this broker (see the module docstring)."""

    def __init__(self, max_sessions: int = 1_000) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], ShareSession] = OrderedDict()

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        """The session of `member_id` in `group_id`, if held here."""
        return self._sessions.get((group_id, member_id))

    def sessions(self) -> list[ShareSession]:
        """Every session held here."""
        return list(self._sessions.values())

    def open(self, group_id: str, member_id: str) -> tuple[ShareSession, ShareSession | None]:
        """A new session at epoch 0 (replacing the member's previous one, returned so its
        records can be released); evicts the least recently used beyond `max_sessions`."""
        key = (group_id, member_id)
        previous = self._sessions.pop(key, None)
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
        session = ShareSession(group_id, member_id)
        self._sessions[key] = session
        return session, previous

    def next(self, group_id: str, member_id: str, epoch: int) -> ShareSession:
        """The session a request at `epoch` (> 0 or -1) continues; its expected epoch moves
        on (a -1 request removes it). SessionError if there is none or the epoch is wrong."""
        key = (group_id, member_id)
        session = self._sessions.get(key)
        if session is None:
            raise SessionError(
                KafkaError.SHARE_SESSION_NOT_FOUND,
                f"no share session of member {member_id!r} of group {group_id!r}",
            )
        if epoch == FINAL_EPOCH:
            del self._sessions[key]
            return session
        if epoch != session.epoch:
            raise SessionError(
                KafkaError.INVALID_SHARE_SESSION_EPOCH,
                f"share session epoch {epoch}, expected {session.epoch}",
            )
        session.epoch = 1 if session.epoch >= 2**31 - 1 else session.epoch + 1
        session.last_used_s = time.monotonic()
        self._sessions.move_to_end(key)
        return session

    @staticmethod
    def update(
        session: ShareSession,
        added: list[SessionPartition],
        forgotten: list[SessionPartition],
    ) -> None:
        """Add the request's partitions to the session and remove the forgotten ones."""
        for tp in forgotten:
            session.partitions.pop(tp, None)
        for tp in added:
            if len(session.partitions) >= MAX_PARTITIONS_PER_SESSION:
                raise SessionError(
                    KafkaError.INVALID_REQUEST,
                    f"more than {MAX_PARTITIONS_PER_SESSION} partitions in a share session",
                )
            session.partitions[tp] = None
