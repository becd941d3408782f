"""The server side of a SASL/SCRAM exchange (RFC 5802, RFC 7677): two client messages in,
two server messages out, checked against a stored credential (salted hashes only).

Pure: no I/O, no clock; the nonce source is injectable for tests. Not thread-safe: one
`ScramServerExchange` per authentication attempt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.security import SCRAM_HASHES

MAX_MESSAGE_BYTES = 4096  # a client message longer than this is not a SCRAM message


class SaslAuthenticationError(Exception):
    """Authentication failed; the message is safe to send to the client and to log (it never
    contains the password or a proof)."""


@dataclass(frozen=True)
class StoredScramCredential:
    """What the server keeps of a user's password for one mechanism."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _unescape_user(name: str) -> str:
    # RFC 5802: ',' and '=' in a username are sent as '=2C' and '=3D'; any other '=' is invalid
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i : i + 3]
            if code == "=2C":
                out.append(",")
            elif code == "=3D":
                out.append("=")
            else:
                raise SaslAuthenticationError("invalid username encoding")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _attributes(message: str) -> list[tuple[str, str]]:
    attrs = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslAuthenticationError("malformed SCRAM message")
        attrs.append((part[0], part[2:]))
    return attrs


class ScramServerExchange:
    """One SCRAM authentication: `first()` then `final()`; `user` is known after `first()`.

    `lookup(user)` returns the user's stored credential for this mechanism, or None.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: Callable[[str], StoredScramCredential | None],
        nonce_fn: Callable[[], str] = lambda: secrets.token_urlsafe(24),
    ):
        if mechanism not in SCRAM_HASHES:
            raise ValueError(f"not a SCRAM mechanism: {mechanism}")
        self.mechanism = mechanism
        self._hash = SCRAM_HASHES[mechanism]
        self._lookup = lookup
        self._nonce_fn = nonce_fn
        self.user: str | None = None
        self._credential: StoredScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""
        self.done = False

    def first(self, client_first: bytes) -> bytes:
        """client-first-message -> server-first-message."""
        if self._server_first:
            raise SaslAuthenticationError("unexpected SCRAM message")
        text = _decode(client_first)
        # gs2-header: "n,," or "y,," (no channel binding) with an optional "a=authzid"
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise SaslAuthenticationError("SCRAM channel binding is not supported")
        authzid = parts[1]
        if authzid and not authzid.startswith("a="):
            raise SaslAuthenticationError("malformed SCRAM gs2 header")
        self._gs2_header = f"{parts[0]},{parts[1]},"
        bare = parts[2]
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise SaslAuthenticationError("malformed SCRAM client-first message")
        if any(k == "m" for k, _ in attrs):
            raise SaslAuthenticationError("SCRAM mandatory extensions are not supported")
        user = _unescape_user(attrs[0][1])
        if not user:
            raise SaslAuthenticationError("empty SCRAM username")
        if authzid and _unescape_user(authzid[2:]) != user:
            raise SaslAuthenticationError("authorization id differs from the username")
        self.user = user
        credential = self._lookup(user)
        if credential is None:
            raise SaslAuthenticationError("Authentication failed: invalid credentials")
        self._credential = credential
        self._client_first_bare = bare
        self._nonce = attrs[1][1] + self._nonce_fn()
        self._server_first = (
            f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},"
            f"i={credential.iterations}"
        )
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """client-final-message -> server-final-message; raises if the proof is wrong."""
        if not self._server_first or self.done or self._credential is None:
            raise SaslAuthenticationError("unexpected SCRAM message")
        text = _decode(client_final)
        if ",p=" not in text:
            raise SaslAuthenticationError("malformed SCRAM client-final message")
        without_proof, proof_b64 = text.rsplit(",p=", 1)
        attrs = dict(_attributes(without_proof))
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if attrs.get("c") != expected_binding:
            raise SaslAuthenticationError("SCRAM channel binding does not match")
        # Kafka's check (ScramSaslServer): the nonce ends with the server-first nonce;
        # librdkafka sends its client nonce in front of it once more
        if not attrs.get("r", "").endswith(self._nonce):
            raise SaslAuthenticationError("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise SaslAuthenticationError("malformed SCRAM proof") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        cred = self._credential
        client_signature = hmac.new(cred.stored_key, auth_message, self._hash).digest()
        if len(proof) != len(client_signature):
            raise SaslAuthenticationError("Authentication failed: invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), cred.stored_key):
            raise SaslAuthenticationError("Authentication failed: invalid credentials")
        self.done = True
        server_signature = hmac.new(cred.server_key, auth_message, self._hash).digest()
        return b"v=" + base64.b64encode(server_signature)


def _decode(message: bytes) -> str:
    if len(message) > MAX_MESSAGE_BYTES:
        raise SaslAuthenticationError("SCRAM message too long")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("SCRAM message is not UTF-8") from None
