"""Fetch and GET tracer loaded into the broker by `catchup_trace_bench.py`.

Only active when `AUTOMQ_CATCHUP_TRACE_DIR` is set and the process is a broker (its argv
names `broker.json`). Records, with `time.monotonic()`: each Fetch request's time from the
handler's start to its answer (and the number of partitions it named), and each object-store
GET (`ObjectStorage._read_span`: start, end, bytes) and each response the transport
could not hand to the kernel at once (over 1 MiB left: from its `drain` until that returns;
start, end, bytes left). One JSON array per line in
`<dir>/broker-<pid>.jsonl`, written every second. A measuring aid, not product code: it
patches functions after their modules are imported.
"""

import collections
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("AUTOMQ_CATCHUP_TRACE_DIR")
_events: collections.deque = collections.deque()


def _flush_forever(path: str) -> None:
    with open(path, "a") as out:
        while True:
            time.sleep(1)
            while _events:
                out.write(json.dumps(_events.popleft()) + "\n")
            out.flush()


def _patch() -> None:
    data_apis = sys.modules["dataplane.kafka.data_apis"]
    store = sys.modules["dataplane.objectstore.store"]
    # every class first (AttributeError while a module is still importing): nothing is
    # patched twice
    fetch, read_span = data_apis.DataApis.fetch, store.ObjectStorage._read_span
    framing = sys.modules["dataplane.kafka.framing"]
    drain = framing.FrameProtocol.drain

    async def traced_fetch(self, req, ctx):
        t0 = time.monotonic()
        try:
            return await fetch(self, req, ctx)
        finally:
            partitions = sum(len(t.partitions) for t in req.topics)
            _events.append(("fetch", t0, time.monotonic(), partitions))

    data_apis.DataApis.fetch = traced_fetch

    def traced_read_span(self, bucket_id, key, start, end_exclusive, priority):
        t0 = time.monotonic()
        data = read_span(self, bucket_id, key, start, end_exclusive, priority)
        _events.append(("get", t0, time.monotonic(), end_exclusive - start))
        return data

    store.ObjectStorage._read_span = traced_read_span

    async def traced_drain(self):
        # called right after a response is handed to the transport: how long the bytes
        # the kernel did not take at once wait to be sent
        pending = self.transport.get_write_buffer_size() if self.transport else 0
        t0 = time.monotonic()
        try:
            return await drain(self)
        finally:
            if pending > 1 << 20:
                _events.append(("write", t0, time.monotonic(), pending))

    framing.FrameProtocol.drain = traced_drain


def _start() -> None:
    time.sleep(0.2)  # sys.argv is set after site runs
    if not any(a.endswith("broker.json") for a in sys.argv):
        return
    threading.Thread(
        target=_flush_forever, args=(f"{_DIR}/broker-{os.getpid()}.jsonl",), daemon=True
    ).start()
    for _ in range(6000):  # up to 5 minutes: a broker starting under load imports late
        if all(
            m in sys.modules
            for m in (
                "dataplane.kafka.data_apis",
                "dataplane.objectstore.store",
                "dataplane.kafka.framing",
            )
        ):
            try:
                _patch()
                return
            except AttributeError:
                pass  # a module still being imported: its classes are not defined yet
        time.sleep(0.05)


if _DIR:
    threading.Thread(target=_start, daemon=True).start()
