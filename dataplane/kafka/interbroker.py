"""The broker-to-broker client: how this broker connects to another one and asks it a Kafka
request (transaction markers, the zone router's forwarded produce, snapshot polls,
forwarded coordinator and admin requests).

Brokers reach each other on their first listener (registered as host:kafka_port). One
`InterBrokerLogin` follows that listener's security protocol: TLS (SSL, SASL_SSL) trusting
the cluster's CA and presenting this broker's client certificate when it has one (mutual
TLS: its CN is the broker principal, a super user); SASL (SASL_PLAINTEXT, SASL_SSL) as the
broker principal with SaslHandshake v1 + SaslAuthenticate v2, SCRAM or PLAIN.

`connect` opens one authenticated connection, `roundtrip` asks one request on it;
`BrokerConnection` keeps one connection to a broker, reconnecting after a failure. All
blocking, bounded by the caller's timeout.
"""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from controlplane.listeners import SASL_PROTOCOLS, TLS_PROTOCOLS
from controlplane.tls import client_ssl_context
from dataplane.formats.client_az import BROKER_CLIENT_ID
from dataplane.kafka.codec import decode_response, encode_request

# the client id of every broker-to-broker request (the zone router serves it as the real
# partition)
CLIENT_ID = BROKER_CLIENT_ID
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
SASL_HANDSHAKE_VERSION, SASL_AUTHENTICATE_VERSION = 1, 2
_correlation = itertools.count(1)


@dataclass(frozen=True)
class InterBrokerLogin:
    """How this broker connects to the others: a SASL login (username None: no SASL) and
    the CA to trust for TLS (None: plaintext), with a client certificate for listeners that
    require one (mutual TLS). The password never appears in a repr or a log."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    mechanism: str = "SCRAM-SHA-512"
    ssl_ca_file: Path | None = None
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None

    @classmethod
    def for_listener(
        cls,
        security_protocol: str,
        *,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
        sasl_mechanism: str = "SCRAM-SHA-512",
        ssl_ca_file: Path | None = None,
        ssl_cert_file: Path | None = None,
        ssl_key_file: Path | None = None,
    ) -> InterBrokerLogin:
        """The login for the other brokers' listener of `security_protocol`: SASL only on
        SASL_*, TLS (the CA and this broker's client certificate) only on *SSL."""
        sasl = security_protocol in SASL_PROTOCOLS
        tls = security_protocol in TLS_PROTOCOLS
        return cls(
            username=sasl_username if sasl else None,
            password=sasl_password if sasl else None,
            mechanism=sasl_mechanism,
            ssl_ca_file=ssl_ca_file if tls else None,
            ssl_cert_file=ssl_cert_file if tls else None,
            ssl_key_file=ssl_key_file if tls else None,
        )

    @property
    def uses_tls(self) -> bool:
        return self.ssl_ca_file is not None

    def tls_context(self) -> ssl.SSLContext:
        """A client TLS context trusting `ssl_ca_file`, with the client certificate if any."""
        assert self.ssl_ca_file is not None
        tls = client_ssl_context(self.ssl_ca_file)
        if self.ssl_cert_file is not None and self.ssl_key_file is not None:
            tls.load_cert_chain(str(self.ssl_cert_file), str(self.ssl_key_file))
        return tls


PLAINTEXT_LOGIN = InterBrokerLogin()


class InterBrokerAuthError(ConnectionError):
    """The other broker refused this broker's login (the message names no secret)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def roundtrip(
    sock: socket.socket,
    req: Any,
    api_key: int,
    version: int,
    sizes: list[int] | None = None,
    client_id: str | None = CLIENT_ID,
) -> Any:
    """Send `req` on `sock` with `client_id` in its header, read its answer; `sizes` gets
    the bytes sent and received (accounting). Raises ConnectionError on a closed
    connection or a bad answer."""
    correlation_id = next(_correlation) & 0x7FFFFFFF
    frame = encode_request(req, correlation_id, client_id=client_id, version=version)
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
    hs = roundtrip(
        sock,
        SaslHandshakeRequest[SASL_HANDSHAKE_VERSION](mechanism=mech),
        int(SaslHandshakeRequest.API_KEY),
        SASL_HANDSHAKE_VERSION,
    )
    if hs.error_code:
        raise InterBrokerAuthError(f"SASL handshake ({mech}) refused: error {hs.error_code}")

    def step(token: bytes) -> bytes:
        resp = roundtrip(
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


def connect(
    host: str, port: int, timeout_s: float, login: InterBrokerLogin | None = None
) -> socket.socket:
    """A connection to the broker at host:port, logged in as `login` (None: plaintext).
    Raises OSError/ConnectionError (InterBrokerAuthError, ssl.SSLError) when the broker
    cannot be reached or refuses the login."""
    login = login or PLAINTEXT_LOGIN
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.settimeout(timeout_s)
        if login.uses_tls:
            sock = login.tls_context().wrap_socket(sock, server_hostname=host)
        if login.username:
            _authenticate(sock, login)
        return sock
    except BaseException:
        sock.close()
        raise


class BrokerConnection:
    """One blocking connection to another broker, opened on first use and again after a
    failure; requests are serialized on it (thread-safe). `on_bytes` gets the bytes of
    each request and its answer (the zone router's broker-to-broker accounting);
    `client_id` goes in each request's header (None: the zone router's own APIs, whose
    handlers never read it, save its bytes)."""

    def __init__(
        self,
        host: str,
        port: int,
        login: InterBrokerLogin | None,
        on_bytes: Callable[[int], None] | None = None,
        client_id: str | None = CLIENT_ID,
    ):
        self.host, self.port, self.login = host, port, login
        self.on_bytes = on_bytes
        self.client_id = client_id
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def call(self, req: Any, timeout_s: float, api_key: int, version: int) -> Any:
        """Ask `req` (of `api_key` at `version`), within `timeout_s` per socket operation;
        the connection is closed (and reopened by the next call) when anything fails."""
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = connect(self.host, self.port, timeout_s, self.login)
                self._sock.settimeout(timeout_s)
                sizes: list[int] = []
                resp = roundtrip(self._sock, req, api_key, version, sizes, self.client_id)
                if self.on_bytes is not None:
                    self.on_bytes(sum(sizes))
                return resp
            except BaseException:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                raise

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
