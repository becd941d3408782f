"""Latency tracer loaded into the broker and `automqctl perf` by `produce_tail_bench.py`.

Only active when `AUTOMQ_PRODUCE_TRACE_DIR` is set (that script puts this directory on the
processes' PYTHONPATH). In the broker it records, with `time.monotonic()`: each request's
time from dispatch to the handler's answer, each WAL append's time from `append` to its
acknowledgement, each `fdatasync` of the file WAL, each upload (start, end), the event
loop's lateness (a 5 ms timer) and a plain thread's wake-up lateness (a 2 ms sleep: CPU and
GIL contention). In the load generator only the thread wake-up lateness, in each of its
processes. One JSON array per line in `<dir>/broker-<pid>.jsonl`, `perf-<pid>.jsonl` (perf's
main process) and `perf-child-<pid>.jsonl` (its producer and consumer processes), written
every 2 s. A measuring
aid, not product code: it patches functions after their modules are imported.
"""

import collections
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("AUTOMQ_PRODUCE_TRACE_DIR")
_events: collections.deque = collections.deque()


def _rec(*event) -> None:
    _events.append(event)


def _flush_forever(path: str) -> None:
    with open(path, "a") as out:
        while True:
            time.sleep(2)
            while _events:
                out.write(json.dumps(_events.popleft()) + "\n")
            out.flush()


def _thread_lag_sampler() -> None:
    while True:
        t0 = time.monotonic()
        time.sleep(0.002)
        _rec("lag", t0, time.monotonic() - t0 - 0.002)


def _trace_broker() -> None:
    storage = sys.modules["dataplane.s3stream.storage"]
    file_wal = sys.modules["dataplane.s3stream.wal.file_wal"]
    wal_metrics = sys.modules["dataplane.s3stream.wal.metrics"]
    registry = sys.modules["dataplane.kafka.registry"]

    upload = storage.S3Storage._upload

    def traced_upload(self, batches, wal_end):
        t0 = time.monotonic()
        try:
            return upload(self, batches, wal_end)
        finally:
            _rec("up", t0, time.monotonic())

    storage.S3Storage._upload = traced_upload
    if os.environ.get("AUTOMQ_PRODUCE_TRACE_NO_UPLOAD"):
        storage.S3Storage._upload_all = lambda self: None  # the WAL holds the run
    fsync_data = file_wal.fsync_data

    def traced_fsync(fd):
        t0 = time.monotonic()
        fsync_data(fd)
        _rec("fs", t0, time.monotonic())

    file_wal.fsync_data = traced_fsync
    latency = wal_metrics.APPEND_LATENCY

    class _Latency:
        def observe(self, value):
            latency.observe(value)
            _rec("wal", time.monotonic(), value)

        def __getattr__(self, name):
            return getattr(latency, name)

    wal_metrics.APPEND_LATENCY = _Latency()
    handle = registry.ApiRegistry.handle
    probing = []

    async def traced_handle(self, request, ctx, registration):
        if not probing:
            import asyncio

            probing.append(True)
            loop = asyncio.get_running_loop()

            def tick(due):
                now = loop.time()
                _rec("loop", time.monotonic(), (now - due) * 1000)
                loop.call_at(now + 0.005, tick, now + 0.005)

            loop.call_soon(tick, loop.time())
        try:
            return await handle(self, request, ctx, registration)
        finally:
            _rec("req", ctx.api_key, ctx.received_at, time.monotonic())

    registry.ApiRegistry.handle = traced_handle
    threading.Thread(target=_thread_lag_sampler, daemon=True, name="trace-lag").start()
    _flush_forever(os.path.join(_DIR, f"broker-{os.getpid()}.jsonl"))


def _boot() -> None:
    wanted = ("dataplane.kafka.registry", "dataplane.s3stream.wal.file_wal")
    for _ in range(240):
        time.sleep(0.5)
        if "cli.perf" in sys.modules and "perf" in sys.argv:
            import multiprocessing

            # perf's producer and consumer processes (spawned: they import this too) trace
            # themselves; the parent only merges their samples
            child = multiprocessing.parent_process() is not None
            name = f"perf-{'child-' if child else ''}{os.getpid()}.jsonl"
            threading.Thread(target=_thread_lag_sampler, daemon=True).start()
            return _flush_forever(os.path.join(_DIR, name))
        if any(a.endswith("broker.json") for a in sys.argv):
            if all(m in sys.modules for m in wanted) and "dataplane.s3stream.storage" in (
                sys.modules
            ):
                time.sleep(1)
                return _trace_broker()


if _DIR:
    threading.Thread(target=_boot, daemon=True, name="produce-trace").start()
