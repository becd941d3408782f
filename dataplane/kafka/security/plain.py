"""SASL/PLAIN (RFC 4616): `[authzid] NUL authcid NUL passwd`, verified against the user's
stored SCRAM credential (the password is hashed with its salt and compared in constant
time, so no plain password is stored anywhere). Pure."""

from __future__ import annotations

import hashlib
import hmac

from controlplane.security import SCRAM_HASHES, keys_from_salted_password
from dataplane.kafka.security.scram import SaslAuthenticationError, StoredScramCredential

MAX_PLAIN_BYTES = 2048


def parse_plain(message: bytes) -> tuple[str, str]:
    """(user, password) of a PLAIN message; SaslAuthenticationError if malformed."""
    if len(message) > MAX_PLAIN_BYTES:
        raise SaslAuthenticationError("PLAIN message too long")
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise SaslAuthenticationError("malformed PLAIN message")
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise SaslAuthenticationError("PLAIN message is not UTF-8") from None
    if not user or not password:
        raise SaslAuthenticationError("PLAIN needs a username and a password")
    if authzid and authzid != user:
        raise SaslAuthenticationError("authorization id differs from the username")
    return user, password


def verify_password(mechanism: str, password: str, credential: StoredScramCredential) -> bool:
    """True if `password` hashes to the credential's stored key."""
    salted = hashlib.pbkdf2_hmac(
        SCRAM_HASHES[mechanism], password.encode(), credential.salt, credential.iterations
    )
    stored, _ = keys_from_salted_password(mechanism, salted)
    return hmac.compare_digest(stored, credential.stored_key)
