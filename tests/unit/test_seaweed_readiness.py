"""The embedded store is ready only when the volumes already on disk are registered with
its master: before that, stored objects read as HTTP 500 "volume id N not found", which
failed brokers starting right after `cluster down` + `cluster up` on a loaded machine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dataplane.objectstore.seaweed import (
    SeaweedConfig,
    registered_volume_ids,
    volume_ids_on_disk,
)


def test_volume_ids_on_disk_reads_plain_and_collection_volumes(tmp_path: Path) -> None:
    for name in ("1.dat", "1.idx", "automq-main_3.dat", "automq-failover_12.dat", "x.dat"):
        (tmp_path / name).write_bytes(b"")
    assert volume_ids_on_disk(tmp_path) == {1, 3, 12}
    assert volume_ids_on_disk(tmp_path / "missing") == set()


def _serve(body: dict) -> ThreadingHTTPServer:
    payload = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            assert self.path == "/vol/status"
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_registered_volume_ids_parses_the_masters_vol_status(tmp_path: Path) -> None:
    # the shape `weed` 4.x answers on /vol/status
    node = [
        {"Collection": "", "Id": 2, "Size": 12176},
        {"Collection": "automq-main", "Id": 1, "Size": 1208},
    ]
    body = {
        "Version": "8000GB 4.48",
        "Volumes": {"DataCenters": {"DefaultDataCenter": {"DefaultRack": {"127.0.0.1:1": node}}}},
    }
    server = _serve(body)
    try:
        config = SeaweedConfig.generate(tmp_path)
        config.ports["master"] = server.server_address[1]
        assert registered_volume_ids(config) == {1, 2}
    finally:
        server.shutdown()
        server.server_close()
    empty = _serve({"Version": "4.48", "Volumes": {"DataCenters": {}}})
    try:
        config.ports["master"] = empty.server_address[1]
        assert registered_volume_ids(config) == set()
    finally:
        empty.shutdown()
        empty.server_close()
