"""Time index benchmark: ListOffsets-by-timestamp lookup time against partition size.

    python benchmarks/time_index_bench.py [--pieces 16,256,2048] [--piece-kib 256]
                                          [--lookups 20] [--runs 3]

For each size, a partition backend (`PartitionLog`) over the real engine and a real
SeaweedFS (in-process controller) gets `pieces` uploaded objects of `piece-kib` each
(records with timestamps 1 ms apart). Then `lookups` random timestamps are looked up with a
cold piece-timestamp cache (each lookup starts empty, as after a move), and the same with a
warm cache. Reported per size: the partition's bytes, median lookup ms (cold, warm), GETs
per cold lookup, and the baseline: the median time of one raw boto3 ranged GET of 64 KiB
from the same store in the same run (a cold lookup should cost about log2(pieces) of them).
JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka.record.memory_records import MemoryRecordsBuilder  # noqa: E402

from controlplane.inprocess import InProcessController  # noqa: E402
from dataplane.config import StorageConfig, WALConfig  # noqa: E402
from dataplane.formats.record_batch import patch_batch  # noqa: E402
from dataplane.kafka.partition_log import PartitionLog  # noqa: E402
from dataplane.kafka.time_index import PieceTimestamps, stored_pieces  # noqa: E402
from dataplane.objectstore import ObjectStorage, object_key, parse_bucket_uris  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from dataplane.s3stream.storage import S3Storage  # noqa: E402
from tests.integration.engine_harness import bucket_uris  # noqa: E402

BASE_TS = 1_700_000_000_000
RECORD_BYTES = 1024


def batch(first_ts: int, count: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=8 << 20)
    for i in range(count):
        builder.append(timestamp=first_ts + i, key=None, value=b"x" * RECORD_BYTES, headers=[])
    builder.close()
    return bytes(builder.buffer())


def engine(controller, store, tmp: Path, node_id: int) -> tuple[S3Storage, ObjectStorage]:
    epoch = controller.call(
        "register_broker",
        {
            "node_id": node_id,
            "az": "a",
            "host": "127.0.0.1",
            "kafka_port": 1,
            "incarnation_id": f"bench-{node_id}",
        },
    )["node_epoch"]
    controller.call("broker_heartbeat", {"node_id": node_id, "node_epoch": epoch})
    objects = ObjectStorage(parse_bucket_uris(bucket_uris(store)), max_concurrency=64)
    config = StorageConfig(
        upload_interval_s=3600,
        block_cache_bytes=16 << 20,  # the smallest: lookups mostly miss it
        log_cache_uploaded_bytes=0,
    )
    storage = S3Storage(
        config,
        node_id,
        epoch,
        controller,
        objects,
        data_dir=tmp / f"node-{node_id}",
        wal=WALConfig(capacity_bytes=256 << 20),
    )
    storage.start()
    return storage, objects


def build_partition(store, tmp: Path, pieces: int, piece_bytes: int):
    """Fill a stream on node 1 (one object per piece), then open it on node 2 as a moved
    partition (nothing cached there)."""
    controller = InProcessController()
    writer, writer_objects = engine(controller, store, tmp, 1)
    stream_id = writer.create_stream()
    stream = writer.open_stream(stream_id, 0)
    per_piece = max(1, piece_bytes // (RECORD_BYTES + 8))
    ts = BASE_TS
    for _ in range(pieces):
        data = batch(ts, per_piece)  # offsets patched in, as the broker does
        base = stream.append_offset
        stream.append_at(base, per_piece, patch_batch(data, base, 0)).result(30)
        ts += per_piece
        writer.flush()
    writer.close()
    writer_objects.close()
    reader, objects = engine(controller, store, tmp, 2)
    plog = PartitionLog(
        "t",
        "t",
        0,
        1,
        reader.open_stream(stream_id, 1),
        pieces_fn=lambda: stored_pieces(controller.machine.image, stream_id),
    )
    return controller, reader, objects, plog, stream_id, ts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieces", default="16,256,2048")
    ap.add_argument("--piece-kib", type=int, default=256)
    ap.add_argument("--lookups", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(7)
    results = []
    with tempfile.TemporaryDirectory() as d, EmbeddedSeaweed(Path(d) / "s3") as store:
        for n in [int(x) for x in args.pieces.split(",")]:
            controller, storage, objects, plog, stream_id, end_ts = build_partition(
                store, Path(d) / f"p{n}", n, args.piece_kib * 1024
            )
            try:
                image = controller.machine.image
                ids = [p.object_id for p in stored_pieces(image, stream_id)]
                raw = []
                for _ in range(args.lookups * args.runs):
                    oid = rng.choice(ids)
                    t0 = time.perf_counter()
                    objects.get_range(0, object_key(oid), 0, 64 * 1024)
                    raw.append((time.perf_counter() - t0) * 1000)
                cold, warm, gets = [], [], []
                for _ in range(args.runs):
                    for _ in range(args.lookups):
                        target = rng.randrange(BASE_TS, end_ts)
                        plog._piece_timestamps = PieceTimestamps()
                        t0 = time.perf_counter()
                        found = plog.offset_for_timestamp(target)
                        cold.append((time.perf_counter() - t0) * 1000)
                        assert found.timestamp_ms == target, (found, target)
                        gets.append(len(plog._piece_timestamps._cache))
                        t0 = time.perf_counter()
                        assert plog.offset_for_timestamp(target).timestamp_ms == target
                        warm.append((time.perf_counter() - t0) * 1000)
                size = sum(p.size_bytes for p in stored_pieces(image, stream_id))
                raw_ms = statistics.median(raw)
                results.append(
                    {
                        "pieces": n,
                        "partition_mib": round(size / 2**20, 1),
                        "cold_lookup_ms": round(statistics.median(cold), 2),
                        "warm_lookup_ms": round(statistics.median(warm), 2),
                        "pieces_read_per_cold_lookup": statistics.median(gets),
                        "raw_64k_get_ms": round(raw_ms, 2),
                        "cold_lookup_in_raw_gets": round(statistics.median(cold) / raw_ms, 1),
                    }
                )
                print(json.dumps(results[-1]), file=sys.stderr)
            finally:
                storage.close()
                objects.close()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
