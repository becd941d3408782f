"""Erasure-coded writes (issue #14): codec speed, bytes stored, produce latency with slow stores.

In one run:
(a) codec: MB/s of raw zfec encode/decode against the project's path (ErasureWriter.shards:
    encode + framing with CRC32C; the reader's path: frame checks + decode + payload CRC);
(b) bytes stored per byte produced: what the six stores' logs grew by over a healthy
    warm-up block;
(c) sequential append latency of the embedded writer to 6 shard-store processes on
    127.0.0.1, healthy, with 2 stores slowed by an injected write delay, and with 2 paused
    (SIGSTOP); the three interleaved in blocks of --block appends on the same stores, so
    the shared disk's noise falls on all three alike; p50/p99 and each run's p99 ratio to
    healthy, medians over --reps (each rep: fresh stores).

Example::

    python benchmarks/erasure_bench.py --record-kib 16 --records 300 --reps 3 --slow-ms 50 --block 25
"""

from __future__ import annotations

import argparse
import itertools
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
    cmd += ["--inject-delay-ms", str(delay_ms), "--inject-delay-off"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        proc.wait()
        raise RuntimeError("shard store did not start")
    return proc, f"127.0.0.1:{line.split()[1]}"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


SLOW = (1, 4)  # the two stores made slow or paused
MODES = ("healthy", "slow", "paused")


class _Stores:
    """Six store processes; `set_mode` makes stores SLOW slow (injected delay, switched over
    HTTP), paused (SIGSTOP) or healthy."""

    def __init__(self, root: Path, slow_ms: int):
        self.procs: list[subprocess.Popen] = []
        self.slow_ms = slow_ms
        addresses = []
        try:
            for i in range(6):
                proc, address = _start(root / f"store-{i}", slow_ms)
                self.procs.append(proc)
                addresses.append(address)
        except BaseException:
            self.close()  # the ones started
            raise
        self.addresses = addresses
        self.root = root
        self._control = [ShardStoreClient(a, timeout_ms=10_000) for a in addresses]

    def set_mode(self, mode: str) -> None:
        for i in SLOW:
            proc = self.procs[i]
            if mode == "paused":
                proc.send_signal(signal.SIGSTOP)
                continue
            proc.send_signal(signal.SIGCONT)
            wanted = self.slow_ms if mode == "slow" else 0
            if self._control[i].set_injected_delay(mode == "slow") != wanted:
                raise RuntimeError(f"store {i} did not switch its delay")

    def stored_bytes(self) -> int:
        # the records' bytes (each log also holds zeroed room past its end)
        return sum(used_log_bytes(self.root / f"store-{i}") for i in range(6))

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()


def _settle(writer: ErasureWriter, stores: _Stores) -> None:
    """Between blocks: heal, wait until no shard of the last block is in flight and no
    store is in back-off, so each block starts as the first would."""
    stores.set_mode("healthy")
    deadline = time.monotonic() + 30
    while not writer.idle():
        if time.monotonic() > deadline:
            raise RuntimeError("the writer did not settle")
        time.sleep(0.01)
    time.sleep(0.1)  # writes a paused store took while stopped land before the next block


def produce_latency(root: Path, record_bytes: int, records: int, slow_ms: int, block: int) -> dict:
    """Sequential appends of the embedded writer; healthy, slow (2 stores delayed by
    `slow_ms`) and paused (2 stores SIGSTOPped) interleaved in blocks of `block` appends on
    the same six stores (the order rotates each cycle), so the disk's and machine's noise
    falls on the three alike (the cycles go through every order of the three). Bytes stored
    per byte produced: a healthy warm-up block."""
    stores = _Stores(root, slow_ms)
    try:
        clients = [ShardStoreClient(a, timeout_ms=2_000) for a in stores.addresses]
        payload = os.urandom(record_bytes)
        latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
        with ErasureWriter(clients, 1) as writer:
            before = stores.stored_bytes()
            for _ in range(block):  # warm-up: connections, files; also the bytes stored
                writer.append(payload)
            _settle(writer, stores)
            stored_per_produced = (stores.stored_bytes() - before) / (block * record_bytes)
            # every order in turn: each mode follows each other equally often
            orders = list(itertools.permutations(MODES))
            for cycle in range(-(-records // block)):
                for mode in orders[cycle % len(orders)]:
                    stores.set_mode(mode)
                    try:
                        for _ in range(block):
                            began = time.perf_counter()
                            writer.append(payload)
                            latencies[mode].append((time.perf_counter() - began) * 1000)
                    finally:
                        _settle(writer, stores)
        out: dict = {"stored_per_produced": stored_per_produced, "latencies_ms": latencies}
        for mode in MODES:
            out[mode] = {
                "p50_ms": _percentile(latencies[mode], 0.5),
                "p99_ms": _percentile(latencies[mode], 0.99),
            }
        for mode in ("slow", "paused"):
            out[mode]["p99_vs_healthy"] = out[mode]["p99_ms"] / out["healthy"]["p99_ms"]
        return out
    finally:
        stores.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record-kib", type=int, default=16)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slow-ms", type=int, default=50)
    parser.add_argument(
        "--block", type=int, default=25, help="appends per block of one mode (interleaved)"
    )
    parser.add_argument("--codec-mib", type=int, default=32)
    parser.add_argument(
        "--dir", default=None, help="where the stores keep their logs (default: a temp dir)"
    )
    args = parser.parse_args()
    record_bytes = args.record_kib * 1024
    summary: dict = {"codec": codec_speed(record_bytes, args.codec_mib * 1024 * 1024)}
    with tempfile.TemporaryDirectory(prefix="erasure-bench-", dir=args.dir) as tmp:
        runs = [
            produce_latency(
                Path(tmp) / f"rep{r}", record_bytes, args.records, args.slow_ms, args.block
            )
            for r in range(args.reps)
        ]
    summary["stored_per_produced"] = round(
        statistics.median(run["stored_per_produced"] for run in runs), 3
    )
    for mode in MODES:
        summary[mode] = {
            key: round(statistics.median(run[mode][key] for run in runs), 3)
            for key in runs[0][mode]
        }
    pooled = {mode: [x for run in runs for x in run["latencies_ms"][mode]] for mode in MODES}
    pooled_p99 = {mode: _percentile(pooled[mode], 0.99) for mode in MODES}
    summary["pooled"] = {
        mode: {
            "samples": len(pooled[mode]),
            "p99_ms": round(pooled_p99[mode], 3),
            "p999_ms": round(_percentile(pooled[mode], 0.999), 3),
            "p99_vs_healthy": round(pooled_p99[mode] / pooled_p99["healthy"], 3),
        }
        for mode in MODES
    }
    summary["runs_p99_vs_healthy"] = {
        mode: [round(run[mode]["p99_vs_healthy"], 2) for run in runs] for mode in ("slow", "paused")
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
