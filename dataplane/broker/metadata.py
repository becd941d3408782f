"""MetadataFollower: a broker's replica of the metadata image, replayed from the log.

It long-polls the controllers' log, applies every record to its own `MetadataImage` (the same
code the controllers run), and starts over from the image snapshot when it fell behind the
log the controllers still keep. Every listener gets each applied batch's `MetadataDelta`
(the keys it touched) and the new image, or `None` and the image after a snapshot was loaded
(anything may have changed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError
from controlplane.image import MetadataDelta, MetadataImage
from controlplane.records import decode_record

log = logging.getLogger(__name__)

# a poll held by a controller whose host was cut off (the leader, mid-election) ends within
# this + METADATA_REQUEST_TIMEOUT_S, before the sessions of that host's brokers expire
LONG_POLL_MS = 2_000
MAX_RECORDS_PER_READ = 2_000

# a listener of the follower: (what the batch changed, or None after a snapshot; the new image)
MetadataListener = Callable[[MetadataDelta | None, MetadataImage], None]


class MetadataFollower:
    """Replays the controllers' metadata log into published images.

    Thread-safety: `image` is replaced (never changed) by the follower thread once per
    applied batch; readers take `follower.image` once and use that image for a whole request.
    """

    def __init__(
        self,
        client: ControllerClient,
        listeners: Sequence[MetadataListener] = (),
    ):
        self.client = client
        self.image = MetadataImage()
        self._listeners: list[MetadataListener] = list(listeners)
        self.log_end_offset = -2  # the controllers' last offset at our last read
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metadata-follower", daemon=True)

    @property
    def offset(self) -> int:
        return self.image.offset

    @property
    def caught_up(self) -> bool:
        """The image has applied everything the controllers had at our last read (a
        partial image, e.g. mid-replay after a restart, must not drive decisions)."""
        return self.image.offset >= self.log_end_offset

    def subscribe(self, listener: MetadataListener) -> None:
        """Add a listener (before `start`: the follower thread calls them in this order)."""
        assert not self._thread.is_alive(), "listeners subscribe before the follower starts"
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self, wait_ms: int = 0) -> int:
        """Read and apply one batch; returns how many records were applied."""
        data = self.client.read_log(self.image.offset, MAX_RECORDS_PER_READ, wait_ms)
        applied: list = []
        delta: MetadataDelta | None = None
        self.log_end_offset = int(data.get("next_offset", 0)) - 1
        if data.get("snapshot") is not None:
            image = MetadataImage.model_validate(data["snapshot"])
            image.offset = data["snapshot_offset"]
            self.image = image
            log.info("loaded metadata snapshot at offset %d", image.offset)
        batch: list[tuple] = []
        expected = self.image.offset + 1
        for item in data.get("records", []):
            if item["offset"] != expected:
                break  # a gap would mean a bug or a truncated log: re-read from our offset
            batch.append((decode_record(item["record"]), item["offset"]))
            expected += 1
        if batch:
            # one new image per batch: readers see all of it or none of it
            self.image, delta = self.image.with_records(batch)
            applied = [rec for rec, _ in batch]
        if applied or data.get("snapshot") is not None:
            if data.get("snapshot") is not None:
                delta = None  # a new image from scratch: anything may have changed
            for listener in self._listeners:
                listener(delta, self.image)
            with self._changed:
                self._changed.notify_all()
        return len(applied)

    def wait_for_offset(self, offset: int, timeout_s: float) -> bool:
        """Block until the image has applied `offset`; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.image.offset < offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.5))
        return True

    def _run(self) -> None:
        backoff_s = 0.1
        while not self._stop.is_set():
            try:
                self.poll_once(LONG_POLL_MS)
                backoff_s = 0.1
            except (ControllerError, OSError) as exc:
                log.warning("metadata log read failed: %s", exc)
                self._stop.wait(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
            except Exception:
                log.exception("applying the metadata log failed")
                self._stop.wait(1.0)
