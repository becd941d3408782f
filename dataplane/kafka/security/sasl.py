"""SASL on a Kafka listener: SaslHandshake + SaslAuthenticate (v0-2) with PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512, and the admission gate that refuses every other request on
a connection that has not authenticated (the server closes it, as Kafka does).

Per-connection state lives in the connection's `ctx.extras` dict (the server shares one
dict per connection): the mechanism chosen by the handshake, the SCRAM exchange in
progress, and, once authenticated, `principal` ("User:alice"). Re-authentication on the
same connection (KIP-368) is a new handshake + authenticate; it must keep the principal.

A failed login is logged with the client address (never the password), counted in
`kafka_sasl_authentication_failures_total`, answered with SASL_AUTHENTICATION_FAILED after a
delay that grows with repeated failures from the same address (LoginThrottle), and the
connection is closed. Thread-safety: handlers run on the server's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from controlplane.image import MetadataImage
from controlplane.security import scram_key
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.security.plain import parse_plain, verify_password
from dataplane.kafka.security.scram import (
    SaslAuthenticationError,
    ScramServerExchange,
    StoredScramCredential,
)
from dataplane.kafka.security.throttle import LoginThrottle

log = logging.getLogger(__name__)

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 18, 17, 36
_BEFORE_AUTH = frozenset({API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})

AUTH_FAILURES = Counter(
    "kafka_sasl_authentication_failures_total",
    "Failed SASL logins on the Kafka listener",
    ["mechanism"],
)
AUTH_SUCCESSES = Counter(
    "kafka_sasl_authentication_successes_total",
    "Successful SASL logins on the Kafka listener",
    ["mechanism"],
)


def principal_of(extras: dict) -> str | None:
    """The authenticated principal of a connection ("User:alice"), or None."""
    return extras.get("principal")


def _sasl_listener(extras: dict) -> bool:
    """Whether the connection came in on a SASL listener (a server that does not say which
    protocol its listener has is one: the single-listener setup)."""
    return extras.get("security_protocol", "SASL_PLAINTEXT") in ("SASL_PLAINTEXT", "SASL_SSL")


class SaslAuthenticator:
    """The SASL handlers and admission gate of one listener."""

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        mechanisms: tuple[str, ...] = SASL_MECHANISMS,
        throttle: LoginThrottle | None = None,
    ):
        unknown = set(mechanisms) - set(SASL_MECHANISMS)
        if unknown or not mechanisms:
            raise ValueError(f"unsupported SASL mechanisms: {sorted(unknown) or 'none given'}")
        self.image_fn = image_fn
        self.mechanisms = tuple(mechanisms)
        self.throttle = throttle or LoginThrottle()

    def registrations(self) -> list:
        """(request class, min version, max version, handler) for the API registry."""
        from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

        # v0 is listed because librdkafka requires it in ApiVersions; the raw SASL frames a
        # v0-only client would send next are not Kafka requests, so such a client is
        # disconnected: every current client authenticates with SaslAuthenticate
        return [
            (SaslHandshakeRequest, 0, 1, self.handshake),
            (SaslAuthenticateRequest, 0, 2, self.authenticate),
        ]

    def admit(self, api_key: int, extras: dict) -> str | None:
        """None if a request of `api_key` may run on this connection, else why not."""
        if api_key in _BEFORE_AUTH or principal_of(extras) is not None:
            return None
        return "request before SASL authentication"

    # ------------------------------------------------------------ credentials

    def _credential(self, mechanism: str, user: str) -> StoredScramCredential | None:
        state = self.image_fn().scram_credentials.get(scram_key(mechanism, user))
        if state is None:
            return None
        return StoredScramCredential(
            salt=base64.b64decode(state.salt),
            iterations=state.iterations,
            stored_key=base64.b64decode(state.stored_key),
            server_key=base64.b64decode(state.server_key),
        )

    def _plain(self, message: bytes) -> str:
        user, password = parse_plain(message)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):  # the cheaper hash first
            credential = self._credential(mechanism, user)
            if credential is not None:
                if verify_password(mechanism, password, credential):
                    return user
                break
        raise SaslAuthenticationError("Authentication failed: invalid username or password")

    # ------------------------------------------------------------ handlers

    async def handshake(self, req: Any, ctx: Any) -> Any:
        cls = response_class(SASL_HANDSHAKE_KEY)
        mechanism = req.mechanism
        if not _sasl_listener(ctx.extras):
            # a PLAINTEXT / SSL listener of a broker that also has SASL ones: Kafka refuses
            ctx.close_after_response = True
            return cls[ctx.api_version](error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=[])
        if ctx.extras.get("sasl_mechanism") is not None:
            # a second handshake before the first authentication finished: Kafka closes
            ctx.close_after_response = True
            return cls[ctx.api_version](
                error_code=KafkaError.ILLEGAL_SASL_STATE, mechanisms=list(self.mechanisms)
            )
        if mechanism not in self.mechanisms:
            log.warning(
                "SASL handshake from %s:%d with unsupported mechanism %r",
                ctx.peer[0],
                ctx.peer[1],
                str(mechanism)[:64],
            )
            ctx.close_after_response = True
            return cls[ctx.api_version](
                error_code=KafkaError.UNSUPPORTED_SASL_MECHANISM, mechanisms=list(self.mechanisms)
            )
        ctx.extras["sasl_mechanism"] = mechanism
        ctx.extras.pop("sasl_exchange", None)
        return cls[ctx.api_version](error_code=KafkaError.NONE, mechanisms=list(self.mechanisms))

    async def authenticate(self, req: Any, ctx: Any) -> Any:
        cls = response_class(SASL_AUTHENTICATE_KEY)
        extras = ctx.extras
        mechanism = extras.get("sasl_mechanism")
        fields: dict[str, Any] = {}
        if ctx.api_version >= 1:
            fields["session_lifetime_ms"] = 0  # no forced re-authentication
        if mechanism is None or not _sasl_listener(extras):
            ctx.close_after_response = True
            return cls[ctx.api_version](
                error_code=KafkaError.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate before SaslHandshake",
                auth_bytes=b"",
                **fields,
            )
        try:
            token = bytes(req.auth_bytes or b"")
            if mechanism == "PLAIN":
                # PBKDF2 of 4096 rounds takes milliseconds: off the event loop
                user = await asyncio.to_thread(self._plain, token)
                answer = b""
            else:
                exchange = extras.get("sasl_exchange")
                if exchange is None:
                    exchange = ScramServerExchange(
                        mechanism, lambda u: self._credential(mechanism, u)
                    )
                    extras["sasl_exchange"] = exchange
                    answer = exchange.first(token)
                    return cls[ctx.api_version](
                        error_code=KafkaError.NONE, error_message=None, auth_bytes=answer, **fields
                    )
                answer = exchange.final(token)
                user = exchange.user or ""
            previous = principal_of(extras)
            if previous is not None and previous != f"User:{user}":
                raise SaslAuthenticationError("re-authentication must keep the principal")
        except SaslAuthenticationError as exc:
            return await self._failed(ctx, mechanism, exc, cls, fields)
        extras.pop("sasl_exchange", None)
        extras.pop("sasl_mechanism", None)
        extras["principal"] = f"User:{user}"
        self.throttle.success(ctx.peer[0])
        AUTH_SUCCESSES.labels(mechanism).inc()
        log.info("%s:%d authenticated as User:%s (%s)", ctx.peer[0], ctx.peer[1], user, mechanism)
        return cls[ctx.api_version](
            error_code=KafkaError.NONE, error_message=None, auth_bytes=answer, **fields
        )

    async def _failed(
        self, ctx: Any, mechanism: str, exc: SaslAuthenticationError, cls: Any, fields: dict
    ) -> Any:
        address = ctx.peer[0]
        delay_s = self.throttle.failure(address)
        AUTH_FAILURES.labels(mechanism).inc()
        exchange = ctx.extras.get("sasl_exchange")
        user = getattr(exchange, "user", None)
        log.warning(
            "failed SASL %s login from %s:%d%s: %s (%d recent failures from this address; "
            "answering in %.2f s)",
            mechanism,
            address,
            ctx.peer[1],
            f" as {user!r}" if user else "",
            exc,
            self.throttle.failures(address),
            delay_s,
        )
        ctx.close_after_response = True
        await asyncio.sleep(delay_s)
        return cls[ctx.api_version](
            error_code=KafkaError.SASL_AUTHENTICATION_FAILED,
            error_message=str(exc),
            auth_bytes=b"",
            **fields,
        )
