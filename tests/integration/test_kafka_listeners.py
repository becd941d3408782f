"""One Kafka server, several listeners (real sockets on 127.0.0.1): each connection knows
the listener it came in on and starts with that listener's state; a mutual-TLS (SSL,
ssl.client.auth=required) listener refuses clients without a certificate of the cluster CA
and makes the certificate's CN the connection's principal."""

from __future__ import annotations

import socket
import ssl
import struct

import pytest

from cli.tls import generate_ca_and_server_cert, generate_client_cert
from dataplane.kafka.codec import decode_response
from dataplane.kafka.security.tls import principal_of_certificate, server_ssl_context
from dataplane.kafka.server import KafkaServerThread, ServerListener
from tests.integration.test_kafka_server import HOST, Cluster, make_registry, metadata_request

pytestmark = pytest.mark.integration


def metadata_over(sock: socket.socket, correlation_id: int = 1):
    sock.sendall(metadata_request(correlation_id, [], 1))
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return decode_response(body, 3, 1)


@pytest.fixture
def certs(tmp_path):
    paths = generate_ca_and_server_cert(tmp_path / "tls", ["127.0.0.1"], ["localhost"])
    alice = generate_client_cert(tmp_path / "tls", "alice", "alice")
    stranger_ca = generate_ca_and_server_cert(tmp_path / "other", ["127.0.0.1"], ["localhost"])
    stranger = generate_client_cert(tmp_path / "other", "mallory", "mallory")
    assert stranger_ca["ca_cert"] != paths["ca_cert"]
    return {**paths, "alice": alice, "mallory": stranger}


def tls_client(port: int, ca: str, cert: dict | None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert["cert"]), str(cert["key"]))
    raw = socket.create_connection((HOST, port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname=HOST)


def test_listeners_each_with_their_own_socket_state_and_mutual_tls(certs):
    seen: list[dict] = []
    cluster = Cluster()

    async def metadata(body, ctx):
        seen.append(dict(ctx.extras))
        return await cluster.metadata(body, ctx)

    registry = make_registry(cluster)
    from kafka.protocol.metadata import MetadataRequest

    registry.register(MetadataRequest, 0, 13, metadata, replace=True)
    mtls = server_ssl_context(
        certs["server_cert"], certs["server_key"], "required", certs["ca_cert"]
    )
    listeners = [
        ServerListener(HOST, 0, "INTERNAL", extras={"principal": "User:ANONYMOUS"}),
        ServerListener(
            HOST,
            0,
            "EXTERNAL",
            ssl_context=mtls,
            extras={"principal": "User:ANONYMOUS"},
            principal_of_peer=principal_of_certificate,
        ),
    ]
    server = KafkaServerThread(registry, listeners=listeners)
    server.start()
    try:
        plain_port, tls_port = server.ports
        assert plain_port != tls_port
        with socket.create_connection((HOST, plain_port), timeout=5) as sock:
            metadata_over(sock)
        with tls_client(tls_port, certs["ca_cert"], certs["alice"]) as sock:
            metadata_over(sock)
        assert seen == [
            {"listener": "INTERNAL", "principal": "User:ANONYMOUS"},
            {"listener": "EXTERNAL", "principal": "User:alice"},
        ]
        # no client certificate, or one of another CA: no request is ever served
        for cert in (None, certs["mallory"]):
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with tls_client(tls_port, certs["ca_cert"], cert) as sock:
                    metadata_over(sock)
        # plaintext on the TLS port gets nothing either; the listeners still serve others
        with socket.create_connection((HOST, tls_port), timeout=5) as sock:
            with pytest.raises((ConnectionError, OSError, struct.error)):
                metadata_over(sock)
        with tls_client(tls_port, certs["ca_cert"], certs["alice"]) as sock:
            metadata_over(sock)
        assert len(seen) == 3
    finally:
        server.stop()


def test_principal_of_certificate():
    cert = {"subject": ((("countryName", "DE"),), (("commonName", "bob"),))}
    assert principal_of_certificate(cert) == "User:bob"
    assert principal_of_certificate({"subject": ((("organizationName", "x"),),)}) is None
    assert principal_of_certificate(None) is None
    assert principal_of_certificate({}) is None


def test_client_auth_needs_a_ca(certs):
    with pytest.raises(ValueError, match="needs the CA"):
        server_ssl_context(certs["server_cert"], certs["server_key"], "required")
    with pytest.raises(ValueError, match="client_auth must be"):
        server_ssl_context(certs["server_cert"], certs["server_key"], "always", certs["ca_cert"])
