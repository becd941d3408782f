"""Committed group offsets kept durably in the controller's replicated KV.

One KV entry per group (`group-offsets/<group>`: JSON of topic -> partition -> offset,
leader epoch, metadata, time). A group has one coordinator broker at a time, which keeps the
group's document in memory and writes it whole on each commit (one Raft commit per
OffsetCommit, atomic for all its partitions). A coordinator that takes a group over reads
the document from the metadata image it follows. The document is bounded (`MAX_DOC_BYTES`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Callable

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage
from dataplane.kafka.groups.offsets import CommittedOffset, OffsetStoreError

KEY_PREFIX = "group-offsets/"
MAX_DOC_BYTES = 900_000  # the controller's KV values are capped at 1 MB


class KVOffsetStore:
    """`OffsetStore` on the controller KV (see the module docstring)."""

    def __init__(self, controller: ControllerClient, image_fn: Callable[[], MetadataImage]):
        self.controller = controller
        self.image_fn = image_fn
        self._docs: dict[str, dict] = {}
        self._lock = threading.Lock()

    def _doc(self, group_id: str) -> dict:
        with self._lock:
            doc = self._docs.get(group_id)
            if doc is None:
                raw = self.image_fn().kv.get(KEY_PREFIX + group_id)
                doc = json.loads(raw) if raw else {}
                self._docs[group_id] = doc
            return doc

    async def commit(self, group_id: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        doc = json.loads(json.dumps(self._doc(group_id)))  # a copy: change only on success
        for (topic, partition), c in offsets.items():
            doc.setdefault(topic, {})[str(partition)] = [c.offset, c.leader_epoch, c.metadata,
                                                         c.commit_timestamp_ms]
        text = json.dumps(doc, separators=(",", ":"))
        if len(text) > MAX_DOC_BYTES:
            raise OffsetStoreError(f"offsets of group {group_id} exceed {MAX_DOC_BYTES} bytes",
                                   error_code=12)  # OFFSET_METADATA_TOO_LARGE
        await self._put(KEY_PREFIX + group_id, text)
        with self._lock:
            self._docs[group_id] = doc

    async def _put(self, key: str, value: str | None) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.controller.call("put_kv", {"key": key, "value": value},
                                                   timeout_s=10))
        except ControllerError as exc:
            raise OffsetStoreError(f"storing offsets failed: {exc}") from None

    async def fetch(self, group_id: str,
                    partitions: list[tuple[str, int]] | None) -> dict[tuple[str, int], CommittedOffset]:
        doc = self._doc(group_id)
        wanted = None if partitions is None else set(partitions)
        out: dict[tuple[str, int], CommittedOffset] = {}
        for topic, parts in doc.items():
            for p, (offset, epoch, metadata, ts) in parts.items():
                key = (topic, int(p))
                if wanted is None or key in wanted:
                    out[key] = CommittedOffset(offset, epoch, metadata, ts)
        return out

    async def delete_group(self, group_id: str) -> None:
        await self._put(KEY_PREFIX + group_id, None)
        with self._lock:
            self._docs.pop(group_id, None)

    async def list_groups(self) -> list[str]:
        names = {k[len(KEY_PREFIX):] for k in self.image_fn().kv if k.startswith(KEY_PREFIX)}
        with self._lock:
            names |= {g for g, d in self._docs.items() if d}
        return sorted(names)

    def forget_all(self) -> None:
        """Drop every cached document (coordinators moved)."""
        with self._lock:
            self._docs.clear()

    def forget(self, group_id: str) -> None:
        """Drop the cached document (this broker no longer coordinates the group)."""
        with self._lock:
            self._docs.pop(group_id, None)
