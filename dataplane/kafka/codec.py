"""Kafka wire-protocol codec: request frames in, response frames out.

Schemas come from kafka-python >= 3 (``kafka.protocol``), whose request/response classes
are generated from Kafka's own JSON message definitions, flexible versions included. This
module adds what a *server* needs and kafka-python (a client) does not do for us:

* ``decode_request(frame)`` parses the request header itself (v1, or v2 = v1 + tagged
  fields for flexible versions), picks the request class by api key, decodes the body with
  kafka-python's compiled decoder and checks that the body did not run past the frame
  (bytes after the body are ignored, as Kafka does). Whatever the bytes, it raises only
  `MalformedRequestError`, `UnknownApiKeyError` or `UnsupportedVersionError`.
* ``encode_response(request, response_obj)`` writes a size-prefixed frame with the right
  response header: v1 (correlation id + empty tagged fields) when the response version is
  flexible, v0 (correlation id only) otherwise, and always v0 for ApiVersions (Kafka's rule,
  so that a client can read the header before it knows which versions the broker speaks).
* ``encode_api_versions_error`` builds Kafka's answer to an ApiVersions request of a version
  the broker does not know: a v0 body with UNSUPPORTED_VERSION and the full api key list,
  so that the client retries with a version both sides support.

A frame here is the bytes *after* the 4-byte size prefix (the server strips it); responses
returned by this module include their size prefix, ready to be written to the socket.

"Versions kafka-python supports" means the class's ``validVersions`` from Kafka's JSON
(e.g. Produce 3-13, Fetch 4-18 for Kafka 4.x); older versions that Kafka 4 removed are
reported as unsupported, as a Kafka 4 broker does.

Pure module: no I/O, imports nothing from the rest of the project.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage

from dataplane.formats.kafka_errors import (
    KafkaError,
    KafkaProtocolError,
    MalformedRequestError,
    ResponseEncodingError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from dataplane.kafka.fetch_encoder import FetchAnswer
from dataplane.kafka.produce_decoder import decode_produce_body
from dataplane.kafka.produce_encoder import ProduceAnswer
from dataplane.kafka.share_fetch_encoder import ShareFetchAnswer

__all__ = [
    "API_VERSIONS_KEY",
    "PRODUCE_KEY",
    "MAX_HEADER_TAGGED_FIELDS",
    "DecodedRequest",
    "KafkaProtocolError",
    "MalformedRequestError",
    "UnknownApiKeyError",
    "UnsupportedVersionError",
    "ResponseEncodingError",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "encode_api_versions_error",
    "known_api_keys",
    "request_class",
    "response_class",
    "supported_versions",
    "is_flexible",
    "request_header_version",
    "response_header_version",
]

PRODUCE_KEY = 0
FETCH_KEY = 1
SHARE_FETCH_KEY = 78
API_VERSIONS_KEY = 18

#: Upper bound on tagged fields accepted in a request header (Kafka defines none today;
#: the bound keeps a hostile header from making us build a huge dict).
MAX_HEADER_TAGGED_FIELDS = 64

_FIXED_HEADER = struct.Struct(">hhi")  # api key, api version, correlation id
_INT16 = struct.Struct(">h")
_RESPONSE_PREFIX = struct.Struct(">ii")  # frame size, correlation id

# kafka-python packages that define the JSON-generated ApiMessage classes. `kafka.protocol.old`
# (the pre-3.0 Struct classes) is deliberately not used.
_PROTOCOL_MODULES = (
    "kafka.protocol.admin",
    "kafka.protocol.consumer",
    "kafka.protocol.metadata",
    "kafka.protocol.producer",
    "kafka.protocol.sasl",
)


def _all_subclasses(cls: type) -> Iterable[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def _load_classes() -> tuple[dict[int, type[ApiMessage]], dict[int, type[ApiMessage]]]:
    for name in _PROTOCOL_MODULES:
        importlib.import_module(name)
    requests: dict[int, type[ApiMessage]] = {}
    responses: dict[int, type[ApiMessage]] = {}
    for cls in _all_subclasses(ApiMessage):
        # Versioned wrappers (ProduceRequest[9]) carry a _class_version; keep the primaries.
        if getattr(cls, "_class_version", None) is not None or getattr(cls, "_json", None) is None:
            continue
        table = requests if cls.is_request() else responses
        key = int(cls.API_KEY)
        if key in table and table[key] is not cls:
            raise RuntimeError(
                f"two kafka-python classes for api key {key}: {table[key]} and {cls}"
            )
        table[key] = cls
    missing = set(requests) ^ set(responses)
    if missing:
        raise RuntimeError(
            f"kafka-python request/response classes do not pair up for keys {sorted(missing)}"
        )
    return requests, responses


_REQUEST_CLASSES, _RESPONSE_CLASSES = _load_classes()


def add_api_message(request_cls: type[ApiMessage], response_cls: type[ApiMessage]) -> None:
    """Make an api of this project's own (a broker-to-broker extension such as the zone
    router's, defined in Kafka's JSON format) decodable. Idempotent; a key that kafka-python
    already defines is a ValueError."""
    key = int(request_cls.API_KEY)
    if int(response_cls.API_KEY) != key or not request_cls.is_request():
        raise ValueError(f"{request_cls!r} and {response_cls!r} are not a request/response pair")
    for table, cls in ((_REQUEST_CLASSES, request_cls), (_RESPONSE_CLASSES, response_cls)):
        if table.get(key, cls) is not cls:
            raise ValueError(f"api key {key} is already {table[key]!r}")
        table[key] = cls


def known_api_keys() -> frozenset[int]:
    """All api keys kafka-python has request/response schemas for."""
    return frozenset(_REQUEST_CLASSES)


def request_class(api_key: int) -> type[ApiMessage] | None:
    """kafka-python's request class for ``api_key`` (primary, unversioned), or None."""
    return _REQUEST_CLASSES.get(api_key)


def response_class(api_key: int) -> type[ApiMessage] | None:
    """kafka-python's response class for ``api_key`` (primary, unversioned), or None."""
    return _RESPONSE_CLASSES.get(api_key)


def supported_versions(api_key: int) -> tuple[int, int] | None:
    """(min, max) versions of ``api_key`` that the codec can decode, from Kafka's JSON."""
    cls = _REQUEST_CLASSES.get(api_key)
    if cls is None:
        return None
    lo, hi = cls.valid_versions
    return int(lo), int(hi)


def is_flexible(api_key: int, api_version: int) -> bool:
    """Whether ``api_version`` of ``api_key`` uses the flexible (compact + tagged) encoding.

    For a version beyond what kafka-python knows, flexibility is extrapolated (flexible
    versions are always "N+" in Kafka's schemas), which is what Kafka does for headers.
    """
    cls = _REQUEST_CLASSES.get(api_key)
    if cls is None:
        return False
    flex = cls._flexible_versions
    return flex is not None and flex[0] >= 0 and api_version >= flex[0]


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header version: 2 for flexible versions, else 1 (v0 is gone in Kafka 4)."""
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header version: 1 for flexible versions, else 0; ApiVersions is always 0."""
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """One decoded request frame.

    ``header`` is a kafka-python ``RequestHeader`` (also attached to ``body.header``);
    ``body`` is the kafka-python request object (e.g. ``ProduceRequest``), with
    ``body.API_VERSION == api_version``. ``header_tagged_fields`` holds raw tagged fields of
    a v2 header (Kafka defines none; kept for completeness). ``size`` is the frame length
    without the size prefix; ``trailing_bytes`` counts bytes after the body, which are
    ignored as Kafka ignores them.
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header: RequestHeader
    body: Any
    header_version: int
    size: int
    header_tagged_fields: Mapping[int, bytes] = field(default_factory=lambda: MappingProxyType({}))
    trailing_bytes: int = 0

    @property
    def api_name(self) -> str:
        """Kafka's name of the api (e.g. ``ProduceRequest``)."""
        return str(type(self.body).name)

    @property
    def expects_response(self) -> bool:
        """False only for requests that get no response (Produce with acks=0)."""
        return bool(self.body.expect_response())


class _Truncated(Exception):
    """Internal: ran off the end of the frame while parsing the header."""


def _read_uvarint(view: memoryview, pos: int) -> tuple[int, int]:
    """Kafka unsigned varint (at most 5 bytes, 32 bits)."""
    value = 0
    for i in range(5):
        if pos >= len(view):
            raise _Truncated("varint runs past the end of the frame")
        b = view[pos]
        pos += 1
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if value > 0xFFFFFFFF:
                raise ValueError("varint larger than 32 bits")
            return value, pos
    raise ValueError("varint longer than 5 bytes")


def _read_client_id(view: memoryview, pos: int) -> tuple[str | None, int]:
    """The header's client id: nullable string with an int16 length (never compact)."""
    if pos + 2 > len(view):
        raise _Truncated("frame ends inside the client id length")
    (length,) = _INT16.unpack_from(view, pos)
    pos += 2
    if length == -1:
        return None, pos
    if length < 0:
        raise ValueError(f"negative client id length {length}")
    end = pos + length
    if end > len(view):
        raise _Truncated("frame ends inside the client id")
    return str(view[pos:end], "utf-8"), end


def _read_tagged_fields(view: memoryview, pos: int) -> tuple[dict[int, bytes], int]:
    count, pos = _read_uvarint(view, pos)
    if count > MAX_HEADER_TAGGED_FIELDS:
        raise ValueError(
            f"{count} tagged fields in the request header (max {MAX_HEADER_TAGGED_FIELDS})"
        )
    tags: dict[int, bytes] = {}
    last_tag = -1
    for _ in range(count):
        tag, pos = _read_uvarint(view, pos)
        if tag <= last_tag:
            raise ValueError(f"tagged field {tag} out of order or repeated")
        last_tag = tag
        size, pos = _read_uvarint(view, pos)
        end = pos + size
        if end > len(view):
            raise _Truncated("frame ends inside a tagged field")
        tags[tag] = bytes(view[pos:end])
        pos = end
    return tags, pos


def _peek_client_id(view: memoryview) -> str | None:
    """Best-effort client id for error reports; never raises."""
    try:
        return _read_client_id(view, _FIXED_HEADER.size)[0]
    except Exception:  # noqa: BLE001 - diagnostics only
        return None


def decode_request(frame: bytes | bytearray | memoryview) -> DecodedRequest:
    """Decode one request frame (without its 4-byte size prefix).

    Raises:
        UnknownApiKeyError: the api key has no kafka-python schema.
        UnsupportedVersionError: a known key with a version outside ``supported_versions``.
        MalformedRequestError: anything else that is wrong with the bytes (short header,
            bad lengths, invalid UTF-8, truncated body, trailing bytes, ...).
        TypeError: ``frame`` is not a bytes-like object (a programming error).

    No other exception escapes for any byte string (a fuzz test holds us to it).

    A Produce request's record sets are read-only views of `frame` (not copies): the
    caller must not change `frame` afterwards.
    """
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise TypeError(f"frame must be bytes-like, not {type(frame).__name__}")
    view = memoryview(frame)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    size = len(view)
    if size < _FIXED_HEADER.size:
        raise MalformedRequestError(f"frame of {size} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(view, 0)
    ids = {"api_key": api_key, "api_version": api_version, "correlation_id": correlation_id}

    cls = _REQUEST_CLASSES.get(api_key)
    if cls is None:
        raise UnknownApiKeyError(api_key, api_version, correlation_id)
    lo, hi = cls.valid_versions
    if not lo <= api_version <= hi:
        raise UnsupportedVersionError(api_key, api_version, correlation_id, _peek_client_id(view))

    flexible = bool(cls.flexible_version_q(api_version))
    try:
        client_id, pos = _read_client_id(view, _FIXED_HEADER.size)
        tags: dict[int, bytes] = {}
        if flexible:
            tags, pos = _read_tagged_fields(view, pos)
    except _Truncated as exc:
        raise MalformedRequestError(f"truncated request header: {exc}", **ids) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequestError(f"invalid request header: {exc}", **ids) from None

    try:
        if api_key == PRODUCE_KEY:
            # the record sets as views of the frame, not copies (produce_decoder.py)
            body, end = decode_produce_body(view, pos, api_version, cls)
        else:
            decoder = cls._struct.compiled_decode_from(
                api_version, compact=flexible, tagged=flexible, data_class=cls
            )
            body, end = decoder(view, pos)
    except Exception as exc:  # noqa: BLE001 - kafka-python raises many types on garbage
        raise MalformedRequestError(
            f"cannot decode {cls.name} v{api_version} body: {type(exc).__name__}: {exc}", **ids
        ) from None
    if end > size:
        # kafka-python slices strings/bytes without bounds checks: running past the end
        # shows up here, as a position beyond the frame.
        raise MalformedRequestError(f"truncated {cls.name} v{api_version} body", **ids)
    # Bytes after the body are ignored, as Kafka ignores them (librdkafka 2.x sends three
    # extra bytes after an all-topics Metadata v13 body).

    header_version = 2 if flexible else 1
    header = RequestHeader(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
        version=header_version,
    )
    # Make the object look like one kafka-python's own decode(header=True) returns.
    body._header = header
    body._min_version = None
    body._max_version = None
    return DecodedRequest(
        api_key=api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
        header=header,
        body=body,
        header_version=header_version,
        size=size,
        header_tagged_fields=MappingProxyType(tags),
        trailing_bytes=size - end,
    )


# --------------------------------------------------------------------------- responses


def _frame(correlation_id: int, header_version: int, body: bytes | bytearray | memoryview) -> bytes:
    """Size prefix + response header + body."""
    tagged = b"\x00" if header_version >= 1 else b""
    size = 4 + len(tagged) + len(body)
    return b"".join((_RESPONSE_PREFIX.pack(size, correlation_id), tagged, body))


Buffer = bytes | bytearray | memoryview


def _frame_of_parts(correlation_id: int, header_version: int, parts: list[Buffer]) -> list[Buffer]:
    """Size prefix + response header, then the body's `parts` as they are (not copied)."""
    tagged = b"\x00" if header_version >= 1 else b""
    size = 4 + len(tagged) + sum(len(p) for p in parts)
    return [_RESPONSE_PREFIX.pack(size, correlation_id), tagged, *parts]


def encode_response(request: DecodedRequest, response_obj: Any) -> bytes | list[Buffer]:
    """Encode ``response_obj`` as the answer to ``request``: a size-prefixed frame.

    ``response_obj`` is the matching kafka-python response object, encoded at the request's
    version whatever version it was built with; or bytes-like: a body already encoded at
    the request's version, to which only the size prefix and the response header are added;
    or a `FetchAnswer` or a `ShareFetchAnswer` (written directly, fetch_encoder.py and
    share_fetch_encoder.py): then the frame is a list of buffers when it carries records
    (the records not copied).
    Raises `ResponseEncodingError` if the object is not the matching kafka-python response
    class or kafka-python cannot encode it (missing/ill-typed fields), or if an answer is
    not of the request's api and version or cannot be written.
    """
    header_version = response_header_version(request.api_key, request.api_version)
    if isinstance(response_obj, ProduceAnswer):
        if response_obj.version != request.api_version:
            raise ResponseEncodingError(
                f"a ProduceResponse v{response_obj.version} to {request.api_name} "
                f"v{request.api_version}"
            )
        body = response_obj.encode_body()  # the common answer, without kafka-python
        response_obj = body if body is not None else response_obj.to_kafka()
    if isinstance(response_obj, FetchAnswer):
        return _answer_frame(request, header_version, response_obj, FETCH_KEY, "FetchResponse")
    if isinstance(response_obj, ShareFetchAnswer):
        return _answer_frame(
            request, header_version, response_obj, SHARE_FETCH_KEY, "ShareFetchResponse"
        )
    if isinstance(response_obj, (bytes, bytearray, memoryview)):
        return _frame(request.correlation_id, header_version, response_obj)
    return _frame(request.correlation_id, header_version, _encode_body(request, response_obj))


def _answer_frame(
    request: DecodedRequest,
    header_version: int,
    answer: FetchAnswer | ShareFetchAnswer,
    api_key: int,
    name: str,
) -> bytes | list[Buffer]:
    """The frame of an answer written directly (a `name` of `api_key`): a list of buffers
    when it carries records."""
    if request.api_key != api_key or answer.version != request.api_version:
        raise ResponseEncodingError(
            f"a {name} v{answer.version} to {request.api_name} v{request.api_version}"
        )
    try:
        parts = answer.encode_parts()
    except (ValueError, AttributeError, TypeError, struct.error) as exc:
        raise ResponseEncodingError(
            f"cannot encode {name} v{answer.version}: {type(exc).__name__}: {exc}"
        ) from exc
    if len(parts) == 1:
        return _frame(request.correlation_id, header_version, parts[0])
    return _frame_of_parts(request.correlation_id, header_version, parts)


def _encode_body(request: DecodedRequest, response_obj: Any) -> bytes:
    expected = _RESPONSE_CLASSES.get(request.api_key)
    if expected is None or not isinstance(response_obj, expected):
        raise ResponseEncodingError(
            f"response to {request.api_name} v{request.api_version} must be "
            f"{getattr(expected, '__name__', '?')}, got {type(response_obj).__name__}"
        )
    try:
        # Set the version without the API_VERSION setter: on an object that carries a
        # ResponseHeader (e.g. one decoded from another broker) kafka-python's setter fails.
        response_obj._version = request.api_version
        return response_obj.encode()
    except Exception as exc:  # noqa: BLE001 - kafka-python raises many types on bad objects
        raise ResponseEncodingError(
            f"cannot encode {type(response_obj).__name__} v{request.api_version}: {type(exc).__name__}: {exc}"
        ) from exc


def encode_api_versions_error(
    correlation_id: int,
    api_keys: Iterable[tuple[int, int, int]],
    error_code: int = KafkaError.UNSUPPORTED_VERSION,
) -> bytes:
    """Kafka's answer to an ApiVersions request it cannot serve: v0 body, v0 header.

    ``api_keys`` is the broker's full list of (api key, min version, max version).
    """
    cls = _RESPONSE_CLASSES[API_VERSIONS_KEY]
    resp = cls(
        version=0,
        error_code=int(error_code),
        api_keys=[
            cls.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in api_keys
        ],
    )
    return _frame(correlation_id, 0, resp.encode(version=0))


# --------------------------------------------------------------------------- client side (tests, tools)


def encode_request(
    request_obj: Any,
    correlation_id: int = 0,
    client_id: str | None = "automq-test",
    version: int | None = None,
) -> bytes:
    """Encode a kafka-python request object as a client would: size prefix + header + body."""
    if version is not None:
        request_obj.API_VERSION = version
    request_obj.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request_obj.encode(header=True, framed=True))


def decode_response(
    frame: bytes | bytearray | memoryview, api_key: int, api_version: int
) -> tuple[int, Any]:
    """Decode a response frame (without size prefix) as a client would: (correlation id, body).

    Uses kafka-python's own response decoding (including its ApiVersions fallback to v0
    when the error code is set), so it checks our encoding against an independent reader.
    """
    cls = _RESPONSE_CLASSES[api_key]
    data = bytes(frame)
    resp = cls[api_version].decode(data, header=True)
    return int(resp.header.correlation_id), resp
