"""The controller API refuses every route without the cluster's secret (a real quorum)."""

from __future__ import annotations

import http.client
import json
import os
import stat

import pytest

from controlplane.auth import generate_secret
from controlplane.client import ControllerClient
from controlplane.errors import ControllerError, ErrorCode
from controlplane.requests import REQUEST_TYPES
from tests.integration.quorum_harness import QuorumHarness

pytestmark = pytest.mark.integration

GET_ROUTES = [
    "/v1/log?after=-1",
    "/v1/status",
    "/v1/image",
    "/v1/balancer",
    "/v1/streams/0",
    "/v1/streams/0/objects",
    "/metrics",
    "/healthz",
    "/v1/no-such-route",
]
SAMPLE_BODY = json.dumps(
    {"name": "stolen", "partitions": 1, "key": "k", "value": "v", "node_id": 1}
).encode()


def _request(address: str, method: str, path: str, headers: dict) -> tuple[int, bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        body = SAMPLE_BODY if method == "POST" else None
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_every_route_needs_the_cluster_secret(tmp_path):
    secret = generate_secret()
    with QuorumHarness(tmp_path / "quorum", voters=1, api_secret=secret) as q:
        leader = q.address(q.leader())
        q.client.call("put_kv", {"key": "before", "value": "1"})
        offset_before = q.client.read_log(-1, max_records=1)["next_offset"]

        routes = [("GET", p) for p in GET_ROUTES]
        routes += [("POST", f"/v1/{command}") for command in sorted(REQUEST_TYPES)]
        credentials = [
            {},
            {"Authorization": "Bearer " + "x" * len(secret)},
            {"Authorization": "Bearer " + secret[:-1]},
            {"Authorization": secret},  # not a bearer credential
            {"Authorization": "Basic " + secret},
        ]
        refused = 0
        for method, path in routes:
            for headers in credentials:
                status, raw = _request(leader, method, path, headers)
                assert status == 401, (method, path, headers, status, raw)
                assert json.loads(raw)["error"]["code"] == "UNAUTHORIZED"
                refused += 1
        assert refused == len(routes) * len(credentials)

        # nothing changed: the metadata log did not move and the key was not overwritten
        assert q.client.read_log(-1, max_records=1)["next_offset"] == offset_before
        assert q.client.image()["kv"] == {"before": "1"}

        # a client without the secret gets a clear, non-retried error
        stranger = ControllerClient([leader], timeout_s=2, api_secret="y" * 32)
        with pytest.raises(ControllerError) as exc:
            stranger.call("put_kv", {"key": "k", "value": "v"})
        assert exc.value.code == ErrorCode.UNAUTHORIZED
        with pytest.raises(ControllerError):
            stranger.image()

        # the secret is also found through the environment (Spark jobs, tools)
        secret_file = q.cluster.api_secret_path
        assert stat.S_IMODE(os.stat(secret_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(q.cluster.dir).st_mode) == 0o700
        env = dict(os.environ)
        try:
            os.environ["AUTOMQ_CONTROLLER_SECRET_FILE"] = str(secret_file)
            os.environ.pop("AUTOMQ_CONTROLLER_SECRET", None)
            from_env = ControllerClient([leader], timeout_s=5)
            assert from_env.image()["kv"] == {"before": "1"}
        finally:
            os.environ.clear()
            os.environ.update(env)
