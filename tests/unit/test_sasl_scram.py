"""SCRAM math against RFC 7677's test vector, PLAIN against stored SCRAM hashes, and the
failed-login throttle."""

from __future__ import annotations

import base64

import pytest

from controlplane.security import keys_from_salted_password, salted_password, scram_upsertion
from dataplane.kafka.security.plain import parse_plain, verify_password
from dataplane.kafka.security.scram import (
    SaslAuthenticationError,
    ScramServerExchange,
    StoredScramCredential,
)
from dataplane.kafka.security.throttle import LoginThrottle

# RFC 7677 section 3
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE_PART = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _credential(password: str = "pencil", mechanism: str = "SCRAM-SHA-256"):
    stored, server = keys_from_salted_password(
        mechanism, salted_password(mechanism, password, SALT, 4096)
    )
    return StoredScramCredential(SALT, 4096, stored, server)


def _exchange(lookup=None) -> ScramServerExchange:
    cred = _credential()
    return ScramServerExchange(
        "SCRAM-SHA-256",
        lookup or (lambda user: cred if user == "user" else None),
        nonce_fn=lambda: SERVER_NONCE_PART,
    )


def test_rfc7677_vector():
    exchange = _exchange()
    assert exchange.first(CLIENT_FIRST) == SERVER_FIRST
    assert exchange.final(CLIENT_FINAL) == SERVER_FINAL
    assert exchange.user == "user" and exchange.done


def test_wrong_proof_is_refused():
    exchange = _exchange()
    exchange.first(CLIENT_FIRST)
    bad = CLIENT_FINAL[:-8] + b"AAAAAAA="
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        exchange.final(bad)
    assert not exchange.done


def test_wrong_password_is_refused():
    wrong = _credential("not-pencil")
    exchange = _exchange(lambda user: wrong)
    exchange.first(CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationError):
        exchange.final(CLIENT_FINAL)


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n,,",
        b"p=tls-unique,,n=user,r=abc",  # channel binding
        b"n,,r=abc,n=user",  # attributes out of order
        b"n,,n=user",  # no nonce
        b"n,,n=us=ZZer,r=abc",  # bad escape
        b"n,,n=user,r=abc,m=ext",  # mandatory extension
        b"\xff\xfe",
        b"n,,n=user,r=" + b"x" * 5000,  # oversized
        b"n,,n=nobody,r=abc",  # unknown user
    ],
)
def test_malformed_client_first_is_refused(message):
    with pytest.raises(SaslAuthenticationError):
        _exchange().first(message)


def test_tampered_final_is_refused():
    for tampered in (
        CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # channel binding header differs
        CLIENT_FINAL.replace(b"r=rOpr", b"r=XOpr"),  # nonce differs
        CLIENT_FINAL.split(b",p=")[0],  # no proof
        CLIENT_FINAL[:-4] + b"!!!!",  # proof not base64
    ):
        exchange = _exchange()
        exchange.first(CLIENT_FIRST)
        with pytest.raises(SaslAuthenticationError):
            exchange.final(tampered)


def test_final_before_first_is_refused():
    with pytest.raises(SaslAuthenticationError):
        _exchange().final(CLIENT_FINAL)


def test_stored_upsertion_matches_the_math_and_hides_the_password():
    up = scram_upsertion("alice", "SCRAM-SHA-512", "s3cret-pw", salt=SALT)
    assert "s3cret-pw" not in up.model_dump_json()
    cred = StoredScramCredential(
        base64.b64decode(up.salt),
        up.iterations,
        base64.b64decode(up.stored_key),
        base64.b64decode(up.server_key),
    )
    assert verify_password("SCRAM-SHA-512", "s3cret-pw", cred)
    assert not verify_password("SCRAM-SHA-512", "s3cret-pX", cred)
    # a fresh salt each time: the same password never stores the same hash
    assert scram_upsertion("a", "SCRAM-SHA-256", "p").stored_key != (
        scram_upsertion("a", "SCRAM-SHA-256", "p").stored_key
    )


def test_parse_plain():
    assert parse_plain(b"\0alice\0pw") == ("alice", "pw")
    assert parse_plain(b"alice\0alice\0pw") == ("alice", "pw")
    for bad in (b"alice\0pw", b"\0\0pw", b"\0alice\0", b"bob\0alice\0pw", b"\0a\0" + b"p" * 3000):
        with pytest.raises(SaslAuthenticationError):
            parse_plain(bad)


def test_login_throttle_grows_is_bounded_and_forgets():
    now = [0.0]
    throttle = LoginThrottle(
        base_delay_s=0.1, max_delay_s=1.0, window_s=10, max_addresses=2, clock=lambda: now[0]
    )
    delays = [throttle.failure("10.0.0.1") for _ in range(6)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert throttle.failure("10.0.0.2") == 0.1  # another address is not slowed
    now[0] = 100.0  # outside the window: counting starts again
    assert throttle.failure("10.0.0.1") == 0.1
    throttle.success("10.0.0.1")
    assert throttle.failures("10.0.0.1") == 0
    for i in range(10):
        throttle.failure(f"10.1.0.{i}")
    assert len(throttle._failures) == 2  # bounded
