"""CPU of the broker's produce path per request, in one process (no sockets, no clients).

    PYTHONPATH=TREE python benchmarks/produce_path_cpu_bench.py [--requests 3000] [--runs 3]
        [--partitions 1]

An in-process broker (the real controller state machine, engine, file WAL in a temp dir,
moto S3; `tests/unit/inprocess_broker.py`) answers `--requests` produce requests of one
batch of 16 x 1 KiB records for each of `--partitions` partitions (a client's request holds
every partition it has a batch ready for), one after another, through the Kafka APIs; the process's
CPU time (every thread: the event loop's handler, the WAL's committer thread) per
request is printed, median over `--runs`, as JSON. With nothing else in the measurement
(no load generator, no object store process, no network), it tells whether a change made
the produce path itself dearer: run it with PYTHONPATH set to each of two checkouts, in
turns. It works on checkouts from before the Kafka APIs were split (`apis.produce`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

RECORDS_PER_BATCH = 16
RECORD_BYTES = 1024
WARMUP_REQUESTS = 200


def request_of(topic: str, records: bytes, partitions: int):
    """A produce request (v9, acks=all) with one batch for each of `partitions` partitions."""
    from kafka.protocol.producer import ProduceRequest

    parts = [
        ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=records)
        for p in range(partitions)
    ]
    return ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=5_000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=parts)],
    )


def one_run(requests: int, partitions: int = 1) -> dict[str, float]:
    from tests.unit.inprocess_broker import inprocess_broker
    from tests.unit.test_kafka_apis_inprocess import batch, ctx

    with tempfile.TemporaryDirectory() as d, inprocess_broker(Path(d)) as (apis, ctrl, sync):
        ctrl.call("create_topic", {"name": "bench", "partitions": partitions})
        sync()
        produce = apis.data.produce if hasattr(apis, "data") else apis.produce
        records = batch([b"v" * RECORD_BYTES] * RECORDS_PER_BATCH)

        def produce_req(topic: str, records: bytes):
            return request_of(topic, records, partitions)

        async def run() -> tuple[float, float]:
            for _ in range(WARMUP_REQUESTS):
                await produce(produce_req("bench", records), ctx(0, 9))
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(requests):
                res = await produce(produce_req("bench", records), ctx(0, 9))
                assert res.responses[0].partition_responses[0].error_code == 0
            return time.process_time() - cpu0, time.perf_counter() - wall0

        cpu_s, wall_s = asyncio.run(run())
    return {
        "cpu_us_per_request": cpu_s / requests * 1e6,
        "wall_us_per_request": wall_s / requests * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=1, help="partitions per request")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    runs = [one_run(args.requests, args.partitions) for _ in range(args.runs)]
    out = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
    out["runs"] = runs
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
