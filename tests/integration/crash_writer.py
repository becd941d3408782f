"""Subprocess for the crash test: appends to a stream and prints each acknowledged offset."""

import json
import sys
from pathlib import Path

from controlplane.client import ControllerClient
from tests.integration.engine_harness import make_engine


class _Store:  # the parts of EmbeddedSeaweed that engine_harness reads
    def __init__(self, cfg: dict):
        self.config = type("C", (), cfg)


def main() -> None:
    args = json.loads(sys.argv[1])
    client = ControllerClient(args["controllers"])
    engine = make_engine(
        client,
        _Store(args["s3"]),
        Path(args["data_dir"]),
        args["node_id"],
        upload_threshold_bytes=args["upload_threshold_bytes"],
    )
    engine.start()
    stream = engine.open_stream(args["stream_id"], args["epoch"])
    print("ready", flush=True)
    for i in range(args["count"]):
        offset = stream.append(f"record-{i}".encode() * 20, 1).result()
        print(f"acked {offset} {i}", flush=True)
    print("done", flush=True)
    sys.stdin.read()  # wait to be killed


if __name__ == "__main__":
    main()
