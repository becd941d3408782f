"""API registry: (api key, version range) -> async handler, and the built-in ApiVersions.

Handlers are business logic written elsewhere; this module only routes. A handler is

    async def handler(body, ctx: RequestContext) -> response_obj | None

where ``body`` is the decoded kafka-python request object (``ctx.api_version`` tells its
version) and the return value is the kafka-python response object (any version: it is
encoded at the request's version), or None for "no response" (Produce with acks=0), or
bytes: a response body already encoded at the request's version (the server adds the size
prefix and the response header).

Ordering: the server *starts* handlers in request order on a connection (each handler runs
synchronously up to its first ``await`` before the next one starts), and runs them
concurrently after that; responses still leave in request order. Kafka applies a
connection's requests one after the other; a handler whose effects must keep that order
(Produce: an idempotent producer pipelines a partition's sequence numbers n, n+1, ... on one
connection) is marked `in_connection_order` (or registered with ``in_order=True``): it
starts once the previous such request of its connection has passed its turn
(`RequestContext.pass_turn`, e.g. once its records are appended, before it waits for their
durability, so requests still pipeline) or ended, however it ended.

Errors: a handler that raises closes its connection (after the responses that precede it
are written) and is logged with its traceback; `CloseConnection` does the same with a short
log line (Kafka closes the connection on an acks=0 Produce error so the producer notices).

ApiVersions is registered automatically (disable with ``ApiRegistry(api_versions=False)``):
it lists every registered key with min/max = the intersection of the registered range and
what kafka-python can decode. An ApiVersions request of a version we do not serve gets the
v0 body with UNSUPPORTED_VERSION and the full list (Kafka's behaviour, so clients retry
with a lower version). A v3+ request whose client software name/version do not match
Kafka's pattern gets INVALID_REQUEST (as a v0 body, see `_handle_api_versions`).

Pure routing: no I/O, imports nothing from the rest of the project.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dataplane.formats.kafka_errors import KafkaError, UnknownApiKeyError, UnsupportedVersionError

from .codec import (
    API_VERSIONS_KEY,
    Buffer,
    DecodedRequest,
    encode_api_versions_error,
    encode_response,
    request_class,
    response_class,
    supported_versions,
)

__all__ = [
    "ApiRegistry",
    "CloseConnection",
    "Handler",
    "Registration",
    "RequestContext",
    "in_connection_order",
]

log = logging.getLogger(__name__)

#: Handler signature: ``await handler(body, ctx)`` -> response object or None (no response).
Handler = Callable[[Any, "RequestContext"], Awaitable[Any | None]]

# Kafka's ApiVersionsRequest.isValid(): client software name and version (v3+).
_SOFTWARE_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


# the attribute `in_connection_order` sets on a handler's function
_IN_ORDER_ATTR = "_kafka_in_connection_order"


def in_connection_order(handler: Handler) -> Handler:
    """Mark `handler` (a function or method, as defined) to run its requests of one
    connection in order: each starts once the previous one passed its turn
    (`RequestContext.pass_turn`) or ended. The registry reads the mark at registration."""
    setattr(handler, _IN_ORDER_ATTR, True)
    return handler


class CloseConnection(Exception):
    """Raise from a handler to close the connection without an error traceback.

    Responses of earlier requests on the connection are still written first.
    """


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request besides its body.

    ``extras`` is the connection's state for the layers above (the server passes the same
    dict to every request of a connection: SASL state, the authenticated principal).
    ``connection_id`` is unique per server connection; ``received_at`` is
    ``time.monotonic()`` when the frame was read (for timeouts and throttling);
    ``request_size`` is the frame's size in bytes (for quotas and metrics).
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    peer: tuple[str, int]
    connection_id: int = 0
    received_at: float = 0.0
    request_size: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    # set by a handler: close the connection once this response is written (a failed
    # SASL authentication, as Kafka does)
    close_after_response: bool = False
    # an in-order request's turn (`Registration.in_order`): done once it passed it
    turn: asyncio.Future[None] | None = None

    def pass_turn(self) -> None:
        """Let the connection's next in-order request start (no-op when this request is not
        in order or already passed it). Event loop only."""
        if self.turn is not None and not self.turn.done():
            self.turn.set_result(None)


@dataclass(frozen=True, slots=True)
class Registration:
    """One registered api: the served version range is already clamped to kafka-python's."""

    api_key: int
    request_class: type
    min_version: int
    max_version: int
    handler: Handler
    in_order: bool = False  # see the module's "Ordering"

    def serves(self, api_version: int) -> bool:
        return self.min_version <= api_version <= self.max_version


class ApiRegistry:
    """Maps api keys to handlers; builds the ApiVersions answer from what is registered."""

    def __init__(self, *, api_versions: bool = True) -> None:
        self._by_key: dict[int, Registration] = {}
        if api_versions:
            cls = request_class(API_VERSIONS_KEY)
            lo, hi = supported_versions(API_VERSIONS_KEY) or (0, 0)
            self.register(cls, lo, hi, self._handle_api_versions)

    # ----------------------------------------------------------------- registration

    def register(
        self,
        request_class_: type,
        min_version: int,
        max_version: int,
        handler: Handler,
        *,
        in_order: bool = False,
        replace: bool = False,
    ) -> Registration:
        """Serve versions ``min_version..max_version`` of ``request_class_`` with ``handler``
        (in connection order when ``in_order`` or marked `in_connection_order`).

        ``request_class_`` is a kafka-python request class (``ProduceRequest`` or a
        versioned ``ProduceRequest[9]``, which means the same). The range is clamped to what
        kafka-python can decode; an empty intersection is a ValueError. Registering a key
        twice is a ValueError unless ``replace=True`` (e.g. to narrow the built-in
        ApiVersions range).
        """
        if not callable(handler):
            raise TypeError("handler must be an async callable")
        try:
            # A versioned wrapper (ProduceRequest[9]) stands for its primary class.
            primary = (
                request_class_[None]
                if getattr(request_class_, "_class_version", None) is not None
                else request_class_
            )
            api_key = int(primary.API_KEY)
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"{request_class_!r} is not a kafka-python request class") from exc
        if request_class(api_key) is not primary:
            raise TypeError(
                f"{request_class_!r} is not the kafka-python request class for api key {api_key}"
            )
        if (
            not isinstance(min_version, int)
            or not isinstance(max_version, int)
            or min_version > max_version
        ):
            raise ValueError(f"bad version range {min_version}..{max_version}")
        lo, hi = supported_versions(api_key)  # type: ignore[misc]
        eff_lo, eff_hi = max(lo, min_version), min(hi, max_version)
        if eff_lo > eff_hi:
            raise ValueError(
                f"{primary.name} versions {min_version}..{max_version} do not overlap what kafka-python "
                f"supports ({lo}..{hi})"
            )
        if api_key in self._by_key and not replace:
            raise ValueError(f"api key {api_key} ({primary.name}) is already registered")
        in_order = in_order or bool(getattr(handler, _IN_ORDER_ATTR, False))
        reg = Registration(api_key, primary, eff_lo, eff_hi, handler, in_order)
        self._by_key[api_key] = reg
        return reg

    def unregister(self, api_key: int) -> None:
        """Stop serving ``api_key`` (no-op if it is not registered)."""
        self._by_key.pop(api_key, None)

    def get(self, api_key: int) -> Registration | None:
        """The registration of ``api_key``, whatever version."""
        return self._by_key.get(api_key)

    def api_versions(self) -> list[tuple[int, int, int]]:
        """(api key, min, max) of every served api, sorted by key: the ApiVersions list."""
        return [(k, r.min_version, r.max_version) for k, r in sorted(self._by_key.items())]

    # ----------------------------------------------------------------- dispatch

    def route(self, request: DecodedRequest) -> Registration:
        """The registration that serves ``request``.

        Raises UnknownApiKeyError for a key we do not serve (Kafka closes the connection)
        and UnsupportedVersionError for a served key with a version out of range.
        """
        reg = self._by_key.get(request.api_key)
        if reg is None:
            raise UnknownApiKeyError(
                request.api_key,
                request.api_version,
                request.correlation_id,
                reason=f"unserved ({request.api_name})",
            )
        if not reg.serves(request.api_version):
            raise UnsupportedVersionError(
                request.api_key, request.api_version, request.correlation_id, request.client_id
            )
        return reg

    def unsupported_version_response(self, error: UnsupportedVersionError) -> bytes | None:
        """The frame to send for an unsupported version, or None to close the connection.

        Only ApiVersions gets an answer (v0, UNSUPPORTED_VERSION, full key list); Kafka
        closes the connection for every other api.
        """
        if error.api_key != API_VERSIONS_KEY or API_VERSIONS_KEY not in self._by_key:
            return None
        return encode_api_versions_error(error.correlation_id, self.api_versions())

    async def handle(
        self, request: DecodedRequest, ctx: RequestContext, registration: Registration | None = None
    ) -> bytes | list[Buffer] | None:
        """Run the handler and encode its answer: the response frame, or None to send nothing.

        Exceptions of the handler (and `ResponseEncodingError` for a bad response object)
        propagate: the caller closes the connection.
        """
        reg = registration if registration is not None else self.route(request)
        result = reg.handler(request.body, ctx)
        if not inspect.isawaitable(result):
            raise TypeError(
                f"handler of {request.api_name} returned {type(result).__name__}, not an awaitable"
            )
        response = await result
        if response is None:
            if request.expects_response:
                log.warning(
                    "handler of %s v%d returned no response for correlation id %d although the client waits for one",
                    request.api_name,
                    request.api_version,
                    request.correlation_id,
                )
            return None
        if not request.expects_response:
            # acks=0: the client does not read a response; sending one would desynchronise it.
            return None
        return encode_response(request, response)

    # ----------------------------------------------------------------- ApiVersions

    def api_versions_response(self, version: int, error_code: int = KafkaError.NONE) -> Any:
        """The ApiVersions response object for ``version`` listing what is registered."""
        cls = response_class(API_VERSIONS_KEY)
        keys = [] if error_code == KafkaError.INVALID_REQUEST else self.api_versions()
        fields: dict[str, Any] = {
            "error_code": int(error_code),
            "api_keys": [
                cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in keys
            ],
        }
        if version >= 1:
            fields["throttle_time_ms"] = 0
        if version >= 3:
            fields.update(
                supported_features=[],
                finalized_features_epoch=-1,
                finalized_features=[],
                zk_migration_ready=False,
            )
        return cls(version=version, **fields)

    async def _handle_api_versions(self, body: Any, ctx: RequestContext) -> Any:
        if ctx.api_version >= 3:
            name = body.client_software_name or ""
            ver = body.client_software_version or ""
            if not (_SOFTWARE_RE.fullmatch(name) and _SOFTWARE_RE.fullmatch(ver)):
                # Kafka answers at the request's version; we answer with a v0 body, which
                # every client reads (kafka-python decodes any ApiVersions error as v0, the
                # Java client falls back to v0 when the requested version does not parse).
                error = self.api_versions_response(0, KafkaError.INVALID_REQUEST)
                return bytes(error.encode(version=0))
        return self.api_versions_response(ctx.api_version)
