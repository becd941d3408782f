"""CPU seconds of the Kafka listener's event-loop thread per GB of Produce requests.

    python benchmarks/listener_bench.py [--request-kib 16,256,1024] [--mib 512] [--runs 3]

A `KafkaServerThread` (the broker's listener: framing, request decoding, the ordered
response writer) serves Produce v9 requests whose handler answers at once, so what is
measured is the listener itself, not the storage behind it. A client thread in the same
process sends `mib` MiB of requests carrying `request-kib` KiB of record bytes each over
one loopback connection, up to 32 in flight. The figure is the CPU time of the server's
event-loop thread alone (`pthread_getcpuclockid`), which other load on the machine barely
changes; run the script from two trees (PYTHONPATH) to compare their listeners.
Prints medians per request size as JSON.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka.protocol.producer import ProduceRequest, ProduceResponse  # noqa: E402

from dataplane.kafka.codec import encode_request  # noqa: E402
from dataplane.kafka.registry import ApiRegistry  # noqa: E402
from dataplane.kafka.server import KafkaServerThread  # noqa: E402

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


def one_run(request_kib: int, mib: int) -> dict:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--request-kib", default="16,256,1024")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    result = {}
    for kib in (int(k) for k in args.request_kib.split(",")):
        runs = [one_run(kib, args.mib) for _ in range(args.runs)]
        result[f"{kib} KiB"] = {
            "cpu_s_per_gb": round(statistics.median(r["cpu_s_per_gb"] for r in runs), 3),
            "mb_s": round(statistics.median(r["mb_s"] for r in runs), 1),
            "runs_cpu_s_per_gb": [round(r["cpu_s_per_gb"], 3) for r in runs],
        }
    print(json.dumps({"tree": str(ROOT), "requests": result}, indent=2))


if __name__ == "__main__":
    main()
