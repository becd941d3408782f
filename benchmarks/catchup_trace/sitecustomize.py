"""Fetch and GET tracer loaded into the broker by `catchup_trace_bench.py`.

Only active when `AUTOMQ_CATCHUP_TRACE_DIR` is set and the process is a broker (its argv
names `broker.json`). Records, with `time.monotonic()`: each Fetch request's time from the
handler's start to its answer (and the number of partitions it named), and each object-store
GET (`ObjectStorage._read_span`: start, end, bytes). One JSON array per line in
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
    apis = sys.modules["dataplane.kafka.apis"]
    store = sys.modules["dataplane.objectstore.store"]
    # both classes first (AttributeError while a module is still importing): nothing is
    # patched twice
    fetch, read_span = apis.KafkaApis.fetch, store.ObjectStorage._read_span

    async def traced_fetch(self, req, ctx):
        t0 = time.monotonic()
        try:
            return await fetch(self, req, ctx)
        finally:
            partitions = sum(len(t.partitions) for t in req.topics)
            _events.append(("fetch", t0, time.monotonic(), partitions))

    apis.KafkaApis.fetch = traced_fetch

    def traced_read_span(self, bucket_id, key, start, end_exclusive, priority):
        t0 = time.monotonic()
        data = read_span(self, bucket_id, key, start, end_exclusive, priority)
        _events.append(("get", t0, time.monotonic(), end_exclusive - start))
        return data

    store.ObjectStorage._read_span = traced_read_span


def _start() -> None:
    time.sleep(0.2)  # sys.argv is set after site runs
    if not any(a.endswith("broker.json") for a in sys.argv):
        return
    threading.Thread(
        target=_flush_forever, args=(f"{_DIR}/broker-{os.getpid()}.jsonl",), daemon=True
    ).start()
    for _ in range(6000):  # up to 5 minutes: a broker starting under load imports late
        if "dataplane.kafka.apis" in sys.modules and "dataplane.objectstore.store" in sys.modules:
            try:
                _patch()
                return
            except AttributeError:
                pass  # a module still being imported: its classes are not defined yet
        time.sleep(0.05)


if _DIR:
    threading.Thread(target=_start, daemon=True).start()
