"""Byte buffers used again once no view of them is left: no zeroing and no first-touch page
faults per buffer.

A fresh buffer of a few MiB costs its zeroing and a page fault per 4 KiB (~1.6 us a page
here: ~0.4 s of CPU per GB of fresh buffers). The GET bodies of a catch-up read
(`objectstore.ranged_get`) and the frames of large Kafka requests (`kafka.framing`) are read
into buffers of a `BufferPool` instead; a buffer is handed out again once the pool holds the
only reference to it, i.e. no view of its last contents (a record payload in a Fetch answer,
a Produce request's record set) is left anywhere.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
from contextlib import AbstractContextManager

__all__ = ["BufferPool", "MAX_POOL_BUFFERS", "MIN_CLASSED_BYTES"]

MAX_POOL_BUFFERS = 256  # a pool keeps at most this many buffers (each take looks through them)
MIN_CLASSED_BYTES = 1024 * 1024  # default: buffers from this size get power-of-two mappings


class BufferPool:
    """Writable buffers used again once nothing holds them. The pool keeps the buffers it
    handed out (at most `max_bytes` of them, `max_buffers` at most); one is free again when
    the pool holds the only reference to it (every view of a buffer keeps it alive through
    its buffer export). A free buffer serves a request of up to its size that is at least
    half its size, or that its size class holds (`buffer_size`). The pool never clears a
    buffer: the taker writes what it reads.

    Requests of `min_classed_bytes` or more get buffers of a power-of-two size, private
    anonymous mappings: any free buffer of the class serves the next request whatever its
    exact size, and a mapping's pages are touched (zeroed by the kernel on first write: no
    memset) only as far as the contents it held reached, so the unused end of a class costs
    address space, not memory. `max_bytes` counts the classes' whole sizes; what stays
    resident is at most that. Requests above `max_buffer_bytes` (None: no bound) get a fresh
    buffer the pool does not keep: one huge request must not stay resident in the pool.

    Thread-safety: `take` is serialized by `lock` (none by default: one thread takes; pass
    a `threading.Lock()` when several do); the buffers' references may be dropped on any
    thread.
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        min_classed_bytes: int = MIN_CLASSED_BYTES,
        max_buffer_bytes: int | None = None,
        max_buffers: int = MAX_POOL_BUFFERS,
        lock: AbstractContextManager[object] | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.min_classed_bytes = min_classed_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.max_buffers = max_buffers
        self._buffers: list[bytearray | mmap.mmap] = []
        self._held_bytes = 0
        self._lock = lock if lock is not None else contextlib.nullcontext()

    @property
    def held_bytes(self) -> int:
        """The sizes of the buffers the pool keeps, in use or free."""
        return self._held_bytes

    def buffer_size(self, size: int) -> int:
        """The size of a fresh buffer for `size` bytes (pure): the next power of two from
        `min_classed_bytes` on, else `size`."""
        if size < self.min_classed_bytes:
            return size
        return 1 << (size - 1).bit_length()

    def take(self, size: int) -> bytearray | mmap.mmap:
        """A writable buffer of at least `size` bytes whose contents nobody reads any more."""
        if self.max_buffer_bytes is not None and size > self.max_buffer_bytes:
            return self._new_buffer(size)
        largest = max(2 * size, self.buffer_size(size))
        with self._lock:
            buffers = self._buffers
            for i in range(len(buffers)):
                # 2 references: the list's and getrefcount's argument (no local name holds it)
                if size <= len(buffers[i]) <= largest and sys.getrefcount(buffers[i]) == 2:
                    # the oldest free one; moved to the end: the list is in order of use
                    buf = buffers.pop(i)
                    buffers.append(buf)
                    return buf
            buf = self._new_buffer(size)
            buffers.append(buf)
            self._held_bytes += len(buf)
            # over the bounds: forget the oldest (one still in use is freed with its last view)
            while len(buffers) > 1 and (
                self._held_bytes > self.max_bytes or len(buffers) > self.max_buffers
            ):
                self._held_bytes -= len(buffers.pop(0))
            return buf

    def _new_buffer(self, size: int) -> bytearray | mmap.mmap:
        """A fresh buffer for `size` bytes: a private anonymous mapping of its class (pages
        zeroed by the kernel when first written), or a small request's own bytearray."""
        if size < self.min_classed_bytes:
            return bytearray(size)
        return mmap.mmap(-1, self.buffer_size(size), flags=mmap.MAP_PRIVATE)
