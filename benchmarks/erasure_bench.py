"""Erasure-coded writes (issue #14): codec speed, bytes stored, produce latency with slow stores.

In one run:
(a) codec: MB/s of raw zfec encode/decode against the project's path (ErasureWriter.shards:
    encode + framing with CRC32C; the reader's path: frame checks + decode + payload CRC);
(b) bytes stored per byte produced: the six stores' log files after the latency runs;
(c) sequential append latency of the embedded writer to 6 shard-store processes on
    127.0.0.1, healthy, with 2 stores slowed by an injected write delay, and with 2 paused
    (SIGSTOP); p50/p99, medians over --reps.

Example::

    python benchmarks/erasure_bench.py --record-kib 16 --records 300 --reps 3 --slow-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zfec  # noqa: E402

from dataplane.erasure.codec import ErasureCodec  # noqa: E402
from dataplane.erasure.holes import classify  # noqa: E402
from dataplane.erasure.shard_format import payload_checksum  # noqa: E402
from dataplane.erasure.store import used_log_bytes  # noqa: E402
from dataplane.erasure.store_client import ShardStoreClient  # noqa: E402
from dataplane.erasure.writer import ErasureWriter  # noqa: E402

MB = 1_000_000


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds


def codec_speed(record_bytes: int, total_bytes: int) -> dict:
    codec = ErasureCodec(4, 2)
    encoder, decoder = zfec.Encoder(4, 6), zfec.Decoder(4, 6)
    payload = os.urandom(record_bytes)
    n = max(1, total_bytes // record_bytes)
    size = codec.block_length(record_bytes)
    blocks = tuple(payload.ljust(size * 4, b"\0")[i * size : (i + 1) * size] for i in range(4))
    began = time.perf_counter()
    for _ in range(n):
        raw = encoder.encode(blocks)
    raw_encode = _mbps(n * record_bytes, time.perf_counter() - began)
    with ErasureWriter([None] * 6, 1, writer_id=1) as writer:  # type: ignore[list-item]
        began = time.perf_counter()
        for _ in range(n):
            frames = writer.shards(123, payload)
        ours_encode = _mbps(n * record_bytes, time.perf_counter() - began)
    use = (2, 3, 4, 5)  # two data blocks lost: parity must be used
    raw_blocks = tuple(raw[i] for i in use)
    began = time.perf_counter()
    for _ in range(n):
        decoder.decode(raw_blocks, use)
    raw_decode = _mbps(n * record_bytes, time.perf_counter() - began)
    began = time.perf_counter()
    for _ in range(n):
        shards = [classify(frames[i], 1, 123, i).shard for i in use]
        out = codec.decode([(s.shard_index, s.block) for s in shards], record_bytes)  # type: ignore[union-attr]
        assert payload_checksum(out) == shards[0].payload_crc  # type: ignore[union-attr]
    ours_decode = _mbps(n * record_bytes, time.perf_counter() - began)
    return {
        "record_bytes": record_bytes,
        "raw_encode_mbps": round(raw_encode, 1),
        "encode_mbps": round(ours_encode, 1),
        "raw_decode_mbps": round(raw_decode, 1),
        "decode_mbps": round(ours_decode, 1),
        "frame_bytes_per_payload_byte": round(sum(len(f) for f in frames) / record_bytes, 4),
    }


def _start(data_dir: Path, delay_ms: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dataplane.erasure.store_server", "--data-dir", str(data_dir)]
    cmd += ["--inject-delay-ms", str(delay_ms)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        raise RuntimeError("shard store did not start")
    return proc, f"127.0.0.1:{line.split()[1]}"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def produce_latency(root: Path, mode: str, record_bytes: int, records: int, slow_ms: int) -> dict:
    procs: list[subprocess.Popen] = []
    try:
        addresses = []
        for i in range(6):
            proc, address = _start(
                root / f"{mode}-{i}", slow_ms if mode == "slow" and i in (1, 4) else 0
            )
            procs.append(proc)
            addresses.append(address)
        if mode == "paused":
            for i in (1, 4):
                procs[i].send_signal(signal.SIGSTOP)
        clients = [ShardStoreClient(a, timeout_ms=2_000) for a in addresses]
        payload = os.urandom(record_bytes)
        latencies = []
        with ErasureWriter(clients, 1) as writer:
            for _ in range(records):
                began = time.perf_counter()
                writer.append(payload)
                latencies.append((time.perf_counter() - began) * 1000)
            for i in (1, 4):
                procs[i].send_signal(signal.SIGCONT)
        time.sleep(0.5)  # background shards land
        # the records' bytes (each log also holds zeroed room past its end)
        stored = sum(used_log_bytes(root / f"{mode}-{i}") for i in range(6))
        return {
            "p50_ms": _percentile(latencies, 0.5),
            "p99_ms": _percentile(latencies, 0.99),
            "stored_per_produced": stored / (records * record_bytes),
        }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record-kib", type=int, default=16)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slow-ms", type=int, default=50)
    parser.add_argument("--codec-mib", type=int, default=32)
    parser.add_argument(
        "--dir", default=None, help="where the stores keep their logs (default: a temp dir)"
    )
    args = parser.parse_args()
    record_bytes = args.record_kib * 1024
    summary: dict = {"codec": codec_speed(record_bytes, args.codec_mib * 1024 * 1024)}
    with tempfile.TemporaryDirectory(prefix="erasure-bench-", dir=args.dir) as tmp:
        for mode in ("healthy", "slow", "paused"):
            runs = [
                produce_latency(
                    Path(tmp) / f"rep{r}", mode, record_bytes, args.records, args.slow_ms
                )
                for r in range(args.reps)
            ]
            summary[mode] = {
                k: round(statistics.median(run[k] for run in runs), 3) for k in runs[0]
            }
    for mode in ("slow", "paused"):
        summary[mode]["p99_vs_healthy"] = round(
            summary[mode]["p99_ms"] / summary["healthy"]["p99_ms"], 2
        )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
