"""CPU of one broker code path in one process, no cluster: the A/B tools.

    python TREE/benchmarks/cpu_paths_bench.py produce [--requests 3000] [--runs 3] [--partitions 1]
    python TREE/benchmarks/cpu_paths_bench.py fetch [--requests 3000] [--runs 3] [--partitions 6] [--version 12]
    python TREE/benchmarks/cpu_paths_bench.py listener [--request-kib 16,256,1024] [--mib 512] [--runs 3]
    python TREE/benchmarks/cpu_paths_bench.py object-writer [--payload-kib 1,16,64] [--object-mib 64] [--runs 5]
    python TREE/benchmarks/cpu_paths_bench.py decode-block [--payload-kib 1,16,64] [--object-mib 64] [--runs 5]

Each mode measures its code from the tree the script is in (run the script of each of two
checkouts, in turns, to compare them) and prints medians as JSON:

- `produce`: an in-process broker (the real controller state machine, engine, file WAL in a
  temp dir, moto S3; `tests/unit/inprocess_broker.py`) answers `--requests` produce requests
  of one batch of 16 x 1 KiB records for each of `--partitions` partitions, one after another,
  through the Kafka APIs: the process's CPU time (the loop's handler and the WAL committer)
  per request. Nothing else is in the measurement (no load generator, no store process, no
  network).
- `fetch`: the same in-process broker; one batch of 16 x 1 KiB records is produced to each of
  `--partitions` partitions, then `--requests` Fetch requests (of `--version`) ask for the
  last batch of every partition, as a tail consumer does: `apis.data.fetch` and
  `encode_response` (the frame the connection writes), the process's CPU time per fetch.
- `listener`: a `KafkaServerThread` (framing, request decoding, the ordered response writer)
  serves Produce v9 requests whose handler answers at once; a client thread sends `--mib` MiB
  of requests of `--request-kib` KiB over one loopback connection, 32 in flight: the CPU time
  of the server's event-loop thread alone (`pthread_getcpuclockid`) per GB.
- `object-writer`: building an upload's object with `ObjectWriter` (add + finish) from
  batches of `--payload-kib` KiB of 6 streams into one `--object-mib` MiB object of 512 KiB
  blocks: CPU s per GB.
- `decode-block`: `decode_block` of every block of such an object (the catch-up read's block
  decode, as the block cache does on a miss): CPU s per GB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402

from dataplane.formats.object_format import ObjectWriter, decode_block  # noqa: E402
from dataplane.formats.stream_records import StreamRecordBatch  # noqa: E402
from dataplane.kafka.codec import decode_request, encode_request, encode_response  # noqa: E402
from dataplane.kafka.registry import ApiRegistry  # noqa: E402
from dataplane.kafka.server import KafkaServerThread  # noqa: E402

# ---------------------------------------------------------------- produce

RECORDS_PER_BATCH = 16
RECORD_BYTES = 1024
WARMUP_REQUESTS = 200


def request_of(topic: str, records: bytes, partitions: int):
    """A produce request (v9, acks=all) with one batch for each of `partitions` partitions."""
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


def produce_run(requests: int, partitions: int = 1) -> dict[str, float]:
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


def in_process_runs(runs: int, run: Callable[[], dict[str, float]]) -> dict:
    """`run()` (an in-process broker's measurement) `runs` times: medians, and each run."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")  # moto's S3 wants credentials
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    results = [run() for _ in range(runs)]
    out: dict = {k: round(statistics.median(r[k] for r in results), 1) for k in results[0]}
    out["runs"] = results
    return out


def produce_mode(args: argparse.Namespace) -> dict:
    return in_process_runs(args.runs, lambda: produce_run(args.requests, args.partitions))


# ---------------------------------------------------------------- fetch


def fetch_request_of(topic: str, offsets: list[int], version: int):
    """A Fetch request of `version` (no wait) from `offsets[p]` of each partition p."""
    from tests.support.kafka_requests import fetch_request

    return fetch_request(
        topic, dict(enumerate(offsets)), version, topic_id=None, max_bytes=50 << 20
    )


def fetch_run(requests: int, partitions: int, version: int) -> dict[str, float]:
    from tests.unit.inprocess_broker import inprocess_broker
    from tests.unit.test_kafka_apis_inprocess import batch, ctx

    if version >= 13:
        raise SystemExit("--version: up to 12 (a topic name, not an id)")
    with tempfile.TemporaryDirectory() as d, inprocess_broker(Path(d)) as (apis, ctrl, sync):
        ctrl.call("create_topic", {"name": "bench", "partitions": partitions})
        sync()
        records = batch([b"v" * RECORD_BYTES] * RECORDS_PER_BATCH)
        # the frame's header only needs the request's api key, version and correlation id
        decoded = decode_request(
            encode_request(fetch_request_of("bench", [0] * partitions, version))[4:]
        )
        context = ctx(1, version)

        async def run() -> tuple[float, float]:
            for _ in range(3):  # a few batches: the fetch reads the last one
                res = await apis.data.produce(request_of("bench", records, partitions), ctx(0, 9))
            bases = [p.base_offset for p in res.responses[0].partition_responses]
            request = fetch_request_of("bench", bases, version)
            frame = encode_response(decoded, await apis.data.fetch(request, context))
            size = len(frame) if isinstance(frame, bytes) else sum(len(p) for p in frame)
            assert size > partitions * RECORD_BYTES * RECORDS_PER_BATCH, size
            for _ in range(WARMUP_REQUESTS):
                encode_response(decoded, await apis.data.fetch(request, context))
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(requests):
                encode_response(decoded, await apis.data.fetch(request, context))
            return time.process_time() - cpu0, time.perf_counter() - wall0

        cpu_s, wall_s = asyncio.run(run())
    return {
        "cpu_us_per_fetch": cpu_s / requests * 1e6,
        "wall_us_per_fetch": wall_s / requests * 1e6,
    }


def fetch_mode(args: argparse.Namespace) -> dict:
    return in_process_runs(
        args.runs, lambda: fetch_run(args.requests, args.partitions, args.version)
    )


# ---------------------------------------------------------------- listener

WINDOW = 32


def produce_frame(correlation_id: int, records: bytes) -> bytes:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    req = ProduceRequest[9](
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[part])],
    )
    return encode_request(req, correlation_id, client_id="bench")


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("server closed the connection")
        out += chunk
    return bytes(out)


def listener_run(request_kib: int, mib: int) -> dict:
    async def produce(body, ctx):
        return ProduceResponse(responses=[], throttle_time_ms=0)

    registry = ApiRegistry()
    registry.register(ProduceRequest, 3, 13, produce)
    frame = produce_frame(1, bytes(request_kib * 1024))
    count = max(1, mib * 1024 // request_kib)
    with KafkaServerThread(registry, max_request_bytes=64 * 1024 * 1024) as srv:
        clock = time.pthread_getcpuclockid(srv._thread.ident)  # type: ignore[union-attr]
        sock = socket.create_connection(("127.0.0.1", srv.port))
        window = threading.Semaphore(WINDOW)
        errors: list[BaseException] = []

        def receive() -> None:
            try:
                for _ in range(count):
                    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
                    recv_exactly(sock, size)
                    window.release()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        receiver = threading.Thread(target=receive)
        cpu0, t0 = time.clock_gettime(clock), time.monotonic()
        receiver.start()
        for _ in range(count):
            window.acquire()
            sock.sendall(frame)
        receiver.join(300)
        wall, cpu = time.monotonic() - t0, time.clock_gettime(clock) - cpu0
        sock.close()
        if errors or receiver.is_alive():
            raise SystemExit(f"client failed: {errors}")
    gb = count * len(frame) / 1e9
    return {"cpu_s_per_gb": cpu / gb, "mb_s": gb * 1000 / wall}


def listener_mode(args: argparse.Namespace) -> dict:
    result = {}
    for kib in _sizes(args.request_kib):
        runs = [listener_run(kib, args.mib) for _ in range(args.runs)]
        result[f"{kib} KiB"] = {
            "cpu_s_per_gb": round(statistics.median(r["cpu_s_per_gb"] for r in runs), 3),
            "mb_s": round(statistics.median(r["mb_s"] for r in runs), 1),
            "runs_cpu_s_per_gb": [round(r["cpu_s_per_gb"], 3) for r in runs],
        }
    return {"requests": result}


# ---------------------------------------------------------------- objects


def _sizes(spec: str) -> list[int]:
    return [int(k) for k in spec.split(",")]


def object_writer_mode(args: argparse.Namespace) -> dict:
    result = {}
    for kib in _sizes(args.payload_kib):
        payload = os.urandom(kib * 1024)
        count = args.object_mib * 1024 // kib
        batches = [StreamRecordBatch(1 + i % 6, 0, i // 6 * 10, 10, payload) for i in range(count)]
        batches.sort(key=lambda b: b.stream_id)
        runs = []
        for _ in range(args.runs):
            t0 = time.process_time()
            writer = ObjectWriter(512 * 1024, 1024 * 1024 * 1024)
            writer.add_all(batches)
            obj = writer.finish()
            runs.append((time.process_time() - t0) / (obj.size_bytes / 1e9))
        result[f"{kib} KiB"] = round(statistics.median(runs), 3)
    return {"cpu_s_per_gb": result}


def decode_block_mode(args: argparse.Namespace) -> dict:
    result = {}
    for kib in _sizes(args.payload_kib):
        writer = ObjectWriter(512 * 1024, 1024 * 1024 * 1024)
        payload = os.urandom(kib * 1024)
        for i in range(args.object_mib * 1024 // kib):
            writer.add(StreamRecordBatch(1, 0, i * 10, 10, payload))
        obj = writer.finish()
        data = memoryview(obj.data)
        blocks = [(e, data[e.position : e.position + e.size]) for e in obj.index]
        runs = []
        for _ in range(args.runs):
            t0 = time.process_time()
            for entry, block in blocks:
                decode_block(block, entry)
            runs.append((time.process_time() - t0) / (len(data) / 1e9))
        result[f"{kib} KiB"] = round(statistics.median(runs), 3)
    return {"cpu_s_per_gb": result}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ap.add_subparsers(dest="mode", required=True)
    produce = modes.add_parser("produce", help="the produce path per request")
    produce.add_argument("--requests", type=int, default=3000)
    produce.add_argument("--runs", type=int, default=3)
    produce.add_argument("--partitions", type=int, default=1, help="partitions per request")
    produce.set_defaults(run=produce_mode)
    fetch = modes.add_parser("fetch", help="the tail fetch path per request")
    fetch.add_argument("--requests", type=int, default=3000)
    fetch.add_argument("--runs", type=int, default=3)
    fetch.add_argument("--partitions", type=int, default=6, help="partitions per request")
    fetch.add_argument("--version", type=int, default=12, help="Fetch version (4-12)")
    fetch.set_defaults(run=fetch_mode)
    listener = modes.add_parser("listener", help="the listener's loop thread per GB")
    listener.add_argument("--request-kib", default="16,256,1024")
    listener.add_argument("--mib", type=int, default=512)
    listener.add_argument("--runs", type=int, default=3)
    listener.set_defaults(run=listener_mode)
    for name, fn in (("object-writer", object_writer_mode), ("decode-block", decode_block_mode)):
        objects = modes.add_parser(name, help=f"{name} CPU per GB")
        objects.add_argument("--payload-kib", default="1,16,64")
        objects.add_argument("--object-mib", type=int, default=64)
        objects.add_argument("--runs", type=int, default=5)
        objects.set_defaults(run=fn)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(json.dumps({"mode": args.mode, "tree": str(ROOT), **args.run(args)}, indent=2))


if __name__ == "__main__":
    main()
