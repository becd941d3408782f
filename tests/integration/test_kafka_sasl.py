"""SASL on a real KafkaServer over TCP: requests before authentication close the
connection, PLAIN and SCRAM logins (with a SCRAM client written here from RFC 5802), and a
fuzzed exchange (truncated, oversized, wrong mechanism, garbage tokens, wrong proofs) closes
only the offending connection while the server keeps serving the others."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import random
import struct
from collections.abc import Iterator

import pytest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from controlplane.requests import AlterScramCredentialsRequest
from controlplane.security import salted_password, scram_upsertion
from controlplane.state_machine import MetadataStateMachine
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import encode_request
from dataplane.kafka.security.sasl import AUTH_FAILURES, SaslAuthenticator
from dataplane.kafka.security.throttle import LoginThrottle
from tests.integration.test_kafka_server import Cluster, Raw, make_registry, running

pytestmark = pytest.mark.integration

PASSWORD = "alice-password"
MAX_REQUEST_BYTES = 1024 * 1024


@pytest.fixture
def sasl_server() -> Iterator[tuple[int, SaslAuthenticator]]:
    machine = MetadataStateMachine()
    req = AlterScramCredentialsRequest(
        upsertions=[
            scram_upsertion("alice", m, PASSWORD) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
        ]
    )
    assert "error" not in machine.execute(req.command, req.model_dump(mode="json"), 0)
    sasl = SaslAuthenticator(
        lambda: machine.image, throttle=LoginThrottle(base_delay_s=0.01, max_delay_s=0.05)
    )
    cluster = Cluster()
    registry = make_registry(cluster)
    for cls, lo, hi, handler in sasl.registrations():
        registry.register(cls, lo, hi, handler)
    with running(
        registry, cluster, admit=sasl.admit, max_request_bytes=MAX_REQUEST_BYTES
    ) as server:
        yield server.port, sasl


@pytest.fixture
def clients() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for c in opened:
        c.close()


def connect(clients: list[Raw], port: int) -> Raw:
    c = Raw(port)
    clients.append(c)
    return c


def handshake(c: Raw, mechanism: str, correlation_id: int = 1):
    c.send(encode_request(SaslHandshakeRequest[1](mechanism=mechanism), correlation_id))
    return c.response(17, 1)[1]


def authenticate(c: Raw, token: bytes, correlation_id: int = 2, version: int = 2):
    c.send(encode_request(SaslAuthenticateRequest[version](auth_bytes=token), correlation_id))
    return c.response(36, version)[1]


def scram_login(c: Raw, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> int:
    """A SCRAM client (RFC 5802): the error code of the final SaslAuthenticate."""
    name = "sha256" if mechanism.endswith("256") else "sha512"
    assert handshake(c, mechanism).error_code == 0
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n={user},r={nonce}"
    resp = authenticate(c, b"n,," + first_bare.encode())
    if resp.error_code:
        return resp.error_code
    server_first = bytes(resp.auth_bytes).decode()
    attrs = dict(a.split("=", 1) for a in server_first.split(","))
    assert attrs["r"].startswith(nonce)
    salted = salted_password(mechanism, password, base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    final = authenticate(c, f"{without_proof},p={proof}".encode(), correlation_id=3)
    if final.error_code == 0:
        server_key = hmac.new(salted, b"Server Key", name).digest()
        expected = base64.b64encode(hmac.new(server_key, auth_message, name).digest())
        assert bytes(final.auth_bytes) == b"v=" + expected  # the server proved itself too
    return final.error_code


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login_then_requests_are_served(sasl_server, clients, mechanism):
    port, _ = sasl_server
    c = connect(clients, port)
    assert scram_login(c, "alice", PASSWORD, mechanism) == 0
    assert c.metadata(10).brokers[0].node_id == 1
    # re-authentication on the same connection (KIP-368) keeps serving
    assert scram_login(c, "alice", PASSWORD, mechanism) == 0
    assert c.metadata(11).brokers[0].node_id == 1


def test_plain_login(sasl_server, clients):
    port, _ = sasl_server
    c = connect(clients, port)
    assert handshake(c, "PLAIN").error_code == 0
    assert authenticate(c, b"\0alice\0" + PASSWORD.encode()).error_code == 0
    assert c.metadata(5).brokers


def test_request_before_authentication_closes_the_connection(sasl_server, clients):
    port, _ = sasl_server
    c = connect(clients, port)
    c.send(encode_request(SaslHandshakeRequest[1](mechanism="PLAIN"), 1))
    c.response(17, 1)
    from tests.integration.test_kafka_server import metadata_request

    c.send(metadata_request(2, ["t"]))
    c.assert_closed()


def _fuzz_cases() -> list[tuple[str, object]]:
    rng = random.Random(1234)
    cases: list[tuple[str, object]] = [
        ("wrong mechanism", ("handshake", "GSSAPI")),
        ("empty mechanism", ("handshake", "")),
        ("authenticate before handshake", ("auth-only", b"\0alice\0x")),
        ("wrong PLAIN password", ("plain", b"\0alice\0wrong")),
        ("PLAIN unknown user", ("plain", b"\0mallory\0" + PASSWORD.encode())),
        ("malformed PLAIN", ("plain", b"alice")),
        ("oversized PLAIN", ("plain", b"\0alice\0" + b"p" * 100_000)),
        ("oversized SCRAM", ("scram-first", b"n,,n=alice,r=" + b"x" * 100_000)),
        ("SCRAM unknown user", ("scram-first", b"n,,n=mallory,r=abc")),
        ("SCRAM wrong password", ("scram-password", "wrong")),
        ("truncated frame", ("raw", struct.pack(">i", 100) + b"\0\x24\0\x02")),
        ("oversized frame", ("raw", struct.pack(">i", MAX_REQUEST_BYTES + 1))),
        ("negative frame", ("raw", struct.pack(">i", -5))),
    ]
    for i in range(12):
        size = rng.choice([0, 1, 7, 64, 600])
        cases.append((f"garbage token {i}", ("scram-first", rng.randbytes(size))))
        cases.append((f"garbage frame {i}", ("raw", struct.pack(">i", size) + rng.randbytes(size))))
    return cases


@pytest.mark.parametrize("case", _fuzz_cases(), ids=lambda c: c[0])
def test_fuzzed_exchange_closes_only_that_connection(sasl_server, clients, case):
    port, sasl = sasl_server
    _, (kind, payload) = case
    # a client that logged in before the bad one, and keeps working after it
    good = connect(clients, port)
    assert scram_login(good, "alice", PASSWORD) == 0
    failures_before = sum(s.value for m in AUTH_FAILURES.collect() for s in m.samples)

    bad = connect(clients, port)
    if kind == "raw":
        bad.send(payload)
        if payload.startswith(struct.pack(">i", 100)):
            bad.sock.shutdown(1)  # truncated: the client gives up mid-frame
    elif kind == "handshake":
        resp = handshake(bad, payload)
        assert resp.error_code == KafkaError.UNSUPPORTED_SASL_MECHANISM
        assert "SCRAM-SHA-512" in resp.mechanisms
    elif kind == "auth-only":
        assert authenticate(bad, payload).error_code == KafkaError.ILLEGAL_SASL_STATE
    elif kind in ("plain", "scram-first"):
        mechanism = "PLAIN" if kind == "plain" else "SCRAM-SHA-256"
        assert handshake(bad, mechanism).error_code == 0
        try:
            resp = authenticate(bad, payload)
        except ConnectionError:
            resp = None  # an oversized frame is dropped without an answer
        if resp is not None:
            assert resp.error_code == KafkaError.SASL_AUTHENTICATION_FAILED
            assert PASSWORD not in (resp.error_message or "")
    elif kind == "scram-password":
        assert scram_login(bad, "alice", payload) == KafkaError.SASL_AUTHENTICATION_FAILED
    bad.assert_closed()

    if kind in ("plain", "scram-first", "scram-password") and "oversized" not in case[0]:
        failures_after = sum(s.value for m in AUTH_FAILURES.collect() for s in m.samples)
        assert failures_after > failures_before
    # the server still serves the client that authenticated, and new logins
    assert good.metadata(20).brokers[0].node_id == 1
    fresh = connect(clients, port)
    assert scram_login(fresh, "alice", PASSWORD, "SCRAM-SHA-512") == 0
    assert fresh.metadata(21).brokers


def test_repeated_failures_are_slowed(sasl_server, clients):
    import time

    port, sasl = sasl_server
    sasl.throttle = LoginThrottle(base_delay_s=0.05, max_delay_s=0.2)
    took = []
    for _ in range(4):
        c = connect(clients, port)
        assert handshake(c, "PLAIN").error_code == 0
        start = time.monotonic()
        assert authenticate(c, b"\0alice\0nope").error_code == KafkaError.SASL_AUTHENTICATION_FAILED
        took.append(time.monotonic() - start)
    assert took[0] >= 0.05 and took[-1] >= 0.2 and took[-1] < 2.0


def test_marker_client_logs_in_as_the_broker_over_tls(tmp_path):
    """The transaction coordinator's WriteTxnMarkers client on a SASL_SSL listener with ACLs:
    the broker super user's markers are served; another user's are refused with
    CLUSTER_AUTHORIZATION_FAILED; no login, a wrong password or an untrusted CA never
    reach the handler."""
    import ssl

    from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

    from cli.tls import generate_ca_and_server_cert
    from dataplane.kafka.interbroker import InterBrokerAuthError, InterBrokerLogin
    from dataplane.kafka.security.authorizer import Authorizer
    from dataplane.kafka.security.enforcement import AclEnforcer
    from dataplane.kafka.security.tls import server_ssl_context
    from dataplane.kafka.txn.marker_client import send_write_txn_markers

    machine = MetadataStateMachine()
    req = AlterScramCredentialsRequest(
        upsertions=[
            scram_upsertion(user, "SCRAM-SHA-512", pw)
            for user, pw in (("broker", "broker-pw"), ("alice", PASSWORD))
        ]
    )
    assert "error" not in machine.execute(req.command, req.model_dump(mode="json"), 0)
    served: list[int] = []

    async def write_markers(body, ctx):
        served.append(body.markers[0].producer_id)
        R = WriteTxnMarkersResponse
        TR = R.WritableTxnMarkerResult.WritableTxnMarkerTopicResult
        return R[1](
            markers=[
                R.WritableTxnMarkerResult(
                    producer_id=m.producer_id,
                    topics=[
                        TR(
                            name=t.name,
                            partitions=[
                                TR.WritableTxnMarkerPartitionResult(partition_index=p, error_code=0)
                                for p in t.partition_indexes
                            ],
                        )
                        for t in m.topics
                    ],
                )
                for m in body.markers
            ]
        )

    registry = make_registry(Cluster())
    registry.register(WriteTxnMarkersRequest, 1, 1, write_markers)
    AclEnforcer(Authorizer(["User:broker"]), lambda: machine.image).install(registry)
    sasl = SaslAuthenticator(lambda: machine.image)
    for cls, lo, hi, handler in sasl.registrations():
        registry.register(cls, lo, hi, handler)
    certs = generate_ca_and_server_cert(tmp_path / "tls", ["127.0.0.1"], ["localhost"])
    other = generate_ca_and_server_cert(tmp_path / "other", ["127.0.0.1"], ["localhost"])
    tls = server_ssl_context(certs["server_cert"], certs["server_key"])
    parts = [("orders", 0), ("orders", 1)]

    def send(login: InterBrokerLogin | None, pid: int) -> dict:
        return send_write_txn_markers("127.0.0.1", port, pid, 0, True, 1, parts, 10.0, login)

    ca = certs["ca_cert"]
    with running(registry, admit=sasl.admit, ssl_context=tls) as server:
        port = server.port
        broker = InterBrokerLogin("broker", "broker-pw", "SCRAM-SHA-512", ca)
        assert send(broker, 1) == {tp: 0 for tp in parts}
        assert "broker-pw" not in repr(broker)
        alice = InterBrokerLogin("alice", PASSWORD, "SCRAM-SHA-512", ca)
        assert send(alice, 2) == {tp: KafkaError.CLUSTER_AUTHORIZATION_FAILED for tp in parts}
        with pytest.raises(ConnectionError):  # no login: the server closes the connection
            send(InterBrokerLogin(ssl_ca_file=ca), 3)
        with pytest.raises(InterBrokerAuthError):
            send(InterBrokerLogin("broker", "wrong", "SCRAM-SHA-512", ca), 4)
        with pytest.raises(ssl.SSLError):
            send(InterBrokerLogin("broker", "broker-pw", "SCRAM-SHA-512", other["ca_cert"]), 5)
    assert served == [1]
