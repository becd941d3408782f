"""The controller side of writing objects: prepare object ids, then commit the objects.

Every writer of objects goes through it: `ObjectUploader` (the engine's uploads, WAL
failover, jobs without a broker), which puts its objects between the two steps itself, and
the Spark compaction driver (`spark_jobs/compact.py`), whose executors put them.

Both steps are retried with a bounded backoff on transient controller errors (no leader,
timeout, not the controller). Repeating a commit is safe: when an earlier attempt was applied
but its answer was lost, the controller answers the repeat `idempotent` (the same objects are
committed already with the same content). When no attempt got an answer, or a repeat was
refused because the metadata moved on meanwhile, a committer that can read the metadata
image (`read_image`) checks whether the commit's objects are committed
(`commit_was_applied`) before it reports the commit as failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from controlplane.calls import ControllerCalls
from controlplane.errors import RETRIABLE_CODES, ControllerError
from controlplane.image import MetadataImage
from controlplane.records import ObjectState
from controlplane.requests import (
    CommitResponse,
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    PrepareObjectsRequest,
    PrepareObjectsResponse,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

COMMIT_ATTEMPTS = 8  # tries of one prepare or commit (= StorageConfig.upload_attempts)
RETRY_FIRST_DELAY_S = 0.1  # backoff between tries: doubles up to RETRY_MAX_DELAY_S
RETRY_MAX_DELAY_S = 5.0


@dataclass(frozen=True)
class Committer:
    """Who commits objects: a broker's node id and its current node epoch (the controller
    fences older epochs; WAL failover commits as this broker with `failover_node_id`), or a
    compaction principal (`compactor`, from `register_compactor`), which needs no broker."""

    node_id: int = -1
    node_epoch: int = -1
    compactor: CompactorIdentity | None = None

    def fields(self) -> dict:
        """The committer fields of a prepare or commit request."""
        if self.compactor is not None:
            return {"compactor": self.compactor}
        return {"node_id": self.node_id, "node_epoch": self.node_epoch}


class CommitOutcomeUnknownError(RuntimeError):
    """No answer to a commit came back and the metadata could not be read to tell whether
    it was applied: its objects may be committed, so they must not be deleted."""


def is_transient_controller_error(exc: BaseException) -> bool:
    """A controller error worth another try of the same call (pure)."""
    return isinstance(exc, ControllerError) and exc.code in RETRIABLE_CODES


def retry_transient(
    call: Callable[[], T],
    attempts: int,
    is_transient: Callable[[BaseException], bool] = is_transient_controller_error,
    what: str = "controller call",
) -> T:
    """`call()`, tried up to `attempts` times while it fails with an error `is_transient`
    says is worth another try (backoff 0.1 s doubling up to 5 s); any other error, or the
    last try's, surfaces at once."""
    delay_s = RETRY_FIRST_DELAY_S
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc) or attempt == attempts:
                raise
            log.warning("%s failed (attempt %d): %s", what, attempt, exc)
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, RETRY_MAX_DELAY_S)
    raise AssertionError("unreachable: the last attempt returns or raises")


def commit_object_ids(request: CommitStreamSetObjectRequest) -> list[int]:
    """The ids of the objects a commit makes visible (its stream-set object, if any, and its
    stream objects) (pure)."""
    return ([request.object_id] if request.object_id >= 0 else []) + [
        so.object_id for so in request.stream_objects
    ]


def commit_was_applied(image: MetadataImage, request: CommitStreamSetObjectRequest) -> bool:
    """Are all the objects of `request` committed in `image` — was the commit (or an earlier
    attempt of it whose answer was lost) applied? (pure)"""
    return all(
        (meta := image.objects.get(object_id)) is not None and meta.state == ObjectState.COMMITTED
        for object_id in commit_object_ids(request)
    )


class ObjectCommitter:
    """Prepares object ids and commits objects with the controller, each step retried on
    transient errors (see the module docstring). `Committer` is who commits; this is how.

    `read_image`: the metadata image as the controller has it now; with it, a commit whose
    answers were lost is checked against the metadata before it is reported as failed.
    """

    def __init__(
        self,
        controller: ControllerCalls,
        attempts: int = COMMIT_ATTEMPTS,
        read_image: Callable[[], MetadataImage] | None = None,
    ):
        self.controller = controller
        self.attempts = attempts
        self._read_image = read_image

    def prepare(self, committer: Committer, count: int, ttl_ms: int) -> PrepareObjectsResponse:
        """Reserve `count` consecutive object ids in the active bucket (`bucket_id` of the
        answer), destroyed by the controller if not committed within `ttl_ms`."""
        request = PrepareObjectsRequest(**committer.fields(), count=count, ttl_ms=ttl_ms)
        return retry_transient(
            lambda: self.controller.prepare_objects(request), self.attempts, what="prepare"
        )

    def commit(self, request: CommitStreamSetObjectRequest) -> CommitResponse:
        """Commit `request` (one atomic metadata command); `idempotent` in the answer: it had
        been applied already (an earlier attempt whose answer was lost). Raises the
        controller's refusal (ControllerError), or CommitOutcomeUnknownError when no answer
        came and the metadata could not be read."""
        answer_lost = False

        def attempt() -> CommitResponse:
            nonlocal answer_lost
            try:
                return self.controller.commit_stream_set_object(request)
            except ControllerError as exc:
                answer_lost = answer_lost or exc.code in RETRIABLE_CODES
                raise

        try:
            return retry_transient(attempt, self.attempts, what="commit")
        except ControllerError as exc:
            if not answer_lost or self._read_image is None:
                raise
            if self._applied_after_lost_answer(request, exc):
                log.info(
                    "the commit of objects %s was applied: its answer was lost (%s)",
                    commit_object_ids(request),
                    exc,
                )
                return CommitResponse(idempotent=True)
            raise

    def _applied_after_lost_answer(
        self, request: CommitStreamSetObjectRequest, error: ControllerError
    ) -> bool:
        """Whether the metadata shows `request` applied (an attempt got no answer)."""
        assert self._read_image is not None
        try:
            image = self._read_image()
        except ControllerError as exc:
            raise CommitOutcomeUnknownError(
                f"commit of objects {commit_object_ids(request)}: no answer ({error}) and the"
                f" metadata could not be read ({exc})"
            ) from exc
        return commit_was_applied(image, request)
