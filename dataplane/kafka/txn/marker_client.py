"""WriteTxnMarkers to another broker (the transaction coordinator -> partition leaders).

One blocking request per call on a fresh connection: markers are written once per
transaction end, per broker, so a pool would save little; bounded by `timeout_s`.

On a SASL cluster the connection first authenticates as the broker principal (a super
user, `InterBrokerLogin`: SaslHandshake v1 + SaslAuthenticate v2 with SCRAM, or PLAIN),
over TLS trusting the cluster's CA when the listener is SASL_SSL (or SSL): WriteTxnMarkers
needs CLUSTER_ACTION there (dataplane/kafka/security/enforcement.py).
"""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.producer import WriteTxnMarkersRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from dataplane.kafka.codec import decode_response, encode_request

CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"  # a group's marker target: (this, slot)
WRITE_TXN_MARKERS_VERSION = 1
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
CLIENT_ID = "automq-txn-coordinator"
_correlation = itertools.count(1)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


@dataclass(frozen=True)
class InterBrokerLogin:
    """How this broker connects to the others: a SASL login (None: no SASL) and the CA
    to trust for TLS (None: plaintext). The password never appears in a repr or a log."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    mechanism: str = "SCRAM-SHA-512"
    ssl_ca_file: Path | None = None
    # a client certificate for listeners that require one (mutual TLS)
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None


class InterBrokerAuthError(ConnectionError):
    """The other broker refused this broker's login (the message names no secret)."""


SASL_HANDSHAKE_VERSION, SASL_AUTHENTICATE_VERSION = 1, 2


def _roundtrip(
    sock: socket.socket, req: Any, api_key: int, version: int, sizes: list[int] | None = None
) -> Any:
    """Send `req`, read its answer; `sizes` gets the bytes sent and received (accounting)."""
    correlation_id = next(_correlation) & 0x7FFFFFFF
    frame = encode_request(req, correlation_id, client_id=CLIENT_ID, version=version)
    sock.sendall(frame)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if not 0 < size <= MAX_RESPONSE_BYTES:
        raise ConnectionError(f"bad response size {size}")
    if sizes is not None:
        sizes.append(len(frame) + 4 + size)
    got, resp = decode_response(_recv_exact(sock, size), api_key, version)
    if got != correlation_id:
        raise ConnectionError(f"correlation id {got}, expected {correlation_id}")
    return resp


def _authenticate(sock: socket.socket, login: InterBrokerLogin) -> None:
    """SASL on a fresh connection (raises InterBrokerAuthError when refused)."""
    from kafka.net.sasl.scram import ScramClient  # kafka-python's RFC 5802 client side

    assert login.username is not None and login.password is not None
    mech = login.mechanism
    hs = _roundtrip(
        sock,
        SaslHandshakeRequest[SASL_HANDSHAKE_VERSION](mechanism=mech),
        int(SaslHandshakeRequest.API_KEY),
        SASL_HANDSHAKE_VERSION,
    )
    if hs.error_code:
        raise InterBrokerAuthError(f"SASL handshake ({mech}) refused: error {hs.error_code}")

    def step(token: bytes) -> bytes:
        resp = _roundtrip(
            sock,
            SaslAuthenticateRequest[SASL_AUTHENTICATE_VERSION](auth_bytes=token),
            int(SaslAuthenticateRequest.API_KEY),
            SASL_AUTHENTICATE_VERSION,
        )
        if resp.error_code:
            raise InterBrokerAuthError(
                f"SASL login as {login.username!r} refused: {resp.error_message or resp.error_code}"
            )
        return bytes(resp.auth_bytes or b"")

    if mech == "PLAIN":
        step(b"\0" + login.username.encode() + b"\0" + login.password.encode())
        return
    scram = ScramClient(login.username, login.password, mech)
    try:
        scram.process_server_first_message(step(scram.first_message()))
        scram.process_server_final_message(step(scram.final_message()))
    except (ValueError, KeyError) as exc:
        raise InterBrokerAuthError(f"SCRAM exchange failed: {exc}") from None


def _connect(host: str, port: int, timeout_s: float, login: InterBrokerLogin | None):
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.settimeout(timeout_s)
        if login is not None and login.ssl_ca_file is not None:
            tls = ssl.create_default_context(cafile=str(login.ssl_ca_file))
            tls.minimum_version = ssl.TLSVersion.TLSv1_2
            if login.ssl_cert_file is not None and login.ssl_key_file is not None:
                tls.load_cert_chain(str(login.ssl_cert_file), str(login.ssl_key_file))
            sock = tls.wrap_socket(sock, server_hostname=host)
        if login is not None and login.username:
            _authenticate(sock, login)
        return sock
    except BaseException:
        sock.close()
        raise


def send_write_txn_markers(
    host: str,
    port: int,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: list[tuple[str, int]],
    timeout_s: float,
    login: InterBrokerLogin | None = None,
) -> dict[tuple[str, int], int]:
    """Send one marker for `partitions` to the broker at host:port; error per partition.
    Raises OSError/ConnectionError (InterBrokerAuthError, ssl.SSLError) when the broker
    cannot be reached or refuses the login."""
    R = WriteTxnMarkersRequest
    topics: dict[str, list[int]] = {}
    for topic, p in partitions:
        topics.setdefault(topic, []).append(p)
    req = R[WRITE_TXN_MARKERS_VERSION](
        markers=[
            R.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                transaction_result=commit,
                topics=[
                    R.WritableTxnMarker.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                    for t, ps in topics.items()
                ],
                coordinator_epoch=coordinator_epoch,
            )
        ]
    )
    with _connect(host, port, timeout_s, login) as sock:
        resp = _roundtrip(sock, req, int(R.API_KEY), WRITE_TXN_MARKERS_VERSION)
    out: dict[tuple[str, int], int] = {}
    for marker in resp.markers:
        for t in marker.topics:
            for p in t.partitions:
                out[(t.name, p.partition_index)] = p.error_code
    return out
