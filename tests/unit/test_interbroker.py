"""The inter-broker client (`dataplane/kafka/interbroker.py`): the login follows the
inter-broker listener's security protocol, and on a listener that requires client
certificates (mutual TLS) the broker's own certificate gets it in."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from pathlib import Path

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from controlplane.records import BrokerEndpoint
from controlplane.tls import server_ssl_context
from dataplane.broker.listeners import inter_broker_login
from dataplane.config import BrokerConfig
from dataplane.kafka.codec import decode_request, encode_response
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin

CA, CERT, KEY = Path("ca.pem"), Path("broker.pem"), Path("broker.key")


@pytest.mark.parametrize(
    ("protocol", "sasl", "tls"),
    [
        ("PLAINTEXT", False, False),
        ("SSL", False, True),
        ("SASL_PLAINTEXT", True, False),
        ("SASL_SSL", True, True),
    ],
)
def test_the_login_follows_the_listener_protocol(protocol, sasl, tls):
    login = InterBrokerLogin.for_listener(
        protocol,
        sasl_username="broker",
        sasl_password="pw",
        sasl_mechanism="PLAIN",
        ssl_ca_file=CA,
        ssl_cert_file=CERT,
        ssl_key_file=KEY,
    )
    assert (login.username, login.password) == (("broker", "pw") if sasl else (None, None))
    assert login.mechanism == "PLAIN"
    files = (login.ssl_ca_file, login.ssl_cert_file, login.ssl_key_file)
    assert files == ((CA, CERT, KEY) if tls else (None, None, None))
    assert login.uses_tls is tls
    assert "pw" not in repr(login)


def _config(**fields) -> BrokerConfig:
    return BrokerConfig(
        node_id=1,
        az="az1",
        kafka_port=9092,
        data_dir=Path("/nonexistent"),
        controllers=["127.0.0.1:1"],
        **fields,
    )


def test_a_broker_of_an_mtls_cluster_logs_in_with_its_client_certificate():
    """`cluster up --tls --mtls` (no SASL): the SSL listener; the zone router, coordinator
    proxy and snapshot reads use this login too, not only transaction markers."""
    cfg = _config(
        tls_cert_file=Path("server.pem"),
        tls_key_file=Path("server.key"),
        tls_ca_file=CA,
        ssl_client_auth="required",
        tls_client_cert_file=CERT,
        tls_client_key_file=KEY,
    )
    login = inter_broker_login(cfg)
    assert login == InterBrokerLogin(ssl_ca_file=CA, ssl_cert_file=CERT, ssl_key_file=KEY)


def test_sasl_is_decided_by_the_inter_broker_listener_not_by_sasl_enabled():
    """Brokers talk on their first listener: a PLAINTEXT one first means no SASL login even
    on a SASL cluster; a SASL_SSL one first means SASL over TLS."""
    endpoint = lambda name, port: BrokerEndpoint(  # noqa: E731
        name=name, host="127.0.0.1", port=port, security_protocol=name
    )
    fields = dict(
        sasl_enabled=True,
        tls_cert_file=Path("server.pem"),
        tls_key_file=Path("server.key"),
        tls_ca_file=CA,
        inter_broker_sasl_username="broker",
        inter_broker_sasl_password="pw",
    )
    plain_first = _config(
        listeners=[endpoint("PLAINTEXT", 9092), endpoint("SASL_SSL", 9093)], **fields
    )
    assert inter_broker_login(plain_first) == InterBrokerLogin()
    sasl_first = _config(
        listeners=[endpoint("SASL_SSL", 9093), endpoint("PLAINTEXT", 9092)], **fields
    )
    assert inter_broker_login(sasl_first) == InterBrokerLogin("broker", "pw", ssl_ca_file=CA)


def _mtls_server(certs: dict[str, Path], handshakes: list[str]) -> socket.socket:
    """A one-connection-at-a-time TLS server requiring a client certificate of the CA; it
    answers each Metadata request with an empty Metadata response."""
    tls = server_ssl_context(
        certs["server_cert"], certs["server_key"], "required", certs["ca_cert"]
    )
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                with tls.wrap_socket(raw, server_side=True) as conn:
                    handshakes.append(conn.getpeercert()["subject"][0][0][1])
                    reader = conn.makefile("rb")
                    (size,) = struct.unpack(">i", reader.read(4))
                    request = decode_request(reader.read(size))
                    frame = encode_response(
                        request, MetadataResponse[1](brokers=[], controller_id=1, topics=[])
                    )
                    conn.sendall(frame if isinstance(frame, bytes) else b"".join(frame))
            except (OSError, ssl.SSLError):
                handshakes.append("refused")
                raw.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_broker_connection_presents_its_client_certificate_to_an_mtls_listener(tmp_path):
    from cli.tls import generate_ca_and_server_cert, generate_client_cert

    certs = generate_ca_and_server_cert(tmp_path, ["127.0.0.1"], ["localhost"])
    mine = generate_client_cert(tmp_path, "broker", "broker")
    cert_file, key_file = mine["cert"], mine["key"]
    handshakes: list[str] = []
    listener = _mtls_server(certs, handshakes)
    port = listener.getsockname()[1]
    with_cert = InterBrokerLogin.for_listener(
        "SSL", ssl_ca_file=certs["ca_cert"], ssl_cert_file=cert_file, ssl_key_file=key_file
    )
    without_cert = InterBrokerLogin.for_listener("SSL", ssl_ca_file=certs["ca_cert"])
    try:
        conn = BrokerConnection("127.0.0.1", port, with_cert)
        try:
            answer = conn.call(MetadataRequest[1](topics=[]), 5.0, 3, 1)
        finally:
            conn.close()
        assert answer.controller_id == 1
        assert handshakes == ["broker"]
        anonymous = BrokerConnection("127.0.0.1", port, without_cert)
        with pytest.raises((OSError, ConnectionError)):  # ssl.SSLError is an OSError
            anonymous.call(MetadataRequest[1](topics=[]), 5.0, 3, 1)
        anonymous.close()
    finally:
        listener.close()


def test_zone_router_requests_carry_no_client_id():
    """Zone routes and snapshot polls (issue #32) go without a client id: 2 bytes fewer in
    every round trip between AZs than the broker-to-broker `~b`; other requests keep it."""
    from dataplane.formats.client_az import BROKER_CLIENT_ID
    from dataplane.zonerouter.protocol import ZONE_ROUTER_CLIENT_ID

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(2)
    seen: list = []

    def answer(count: int) -> None:
        for _ in range(count):
            conn, _ = server.accept()
            with conn:
                (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
                request = decode_request(conn.recv(size, socket.MSG_WAITALL))
                seen.append(request.client_id)
                conn.sendall(encode_response(request, MetadataResponse[1](brokers=[], topics=[])))

    thread = threading.Thread(target=answer, args=(2,), daemon=True)
    thread.start()
    host, port = server.getsockname()
    sizes: list[int] = []
    try:
        for client_id in (ZONE_ROUTER_CLIENT_ID, BROKER_CLIENT_ID):
            conn = BrokerConnection(host, port, None, sizes.append, client_id)
            conn.call(MetadataRequest[1](topics=[]), 5.0, 3, 1)
            conn.close()
        thread.join(5)
    finally:
        server.close()
    assert seen == [None, BROKER_CLIENT_ID]
    assert sizes[1] - sizes[0] == 2
