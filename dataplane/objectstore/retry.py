"""Which S3 failures are worth retrying, how long to back off, and how to name them.

Every operation we issue is safe to repeat: GET/HEAD/LIST read, DELETE of a missing key
succeeds, and PUT writes a write-once key (the same bytes again). So the rule is about the
*failure*, not the operation:

* retried: timeouts, refused/reset connections, truncated bodies, HTTP 5xx, 429 and the S3
  throttling codes (SlowDown, RequestTimeout, ConditionalRequestConflict, ...);
* final at once: 404 (-> ObjectNotFoundError), 412 (-> PreconditionFailedError),
  403 / missing credentials (-> AccessDeniedError), 416 (-> InvalidRangeError), other 4xx.

Backoff is exponential with "equal jitter": attempt n sleeps between d/2 and d, where
d = min(backoff_max_ms, backoff_base_ms * 2**(n-1)).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from .errors import (
    AccessDeniedError,
    InvalidRangeError,
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
    PreconditionFailedError,
)

_NOT_FOUND_CODES = {"NoSuchKey", "NotFound", "404"}
_ACCESS_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AllAccessDisabled",
    "InvalidSecurity",
    "403",
}
_RETRY_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "ConditionalRequestConflict",
    "OperationAborted",
    "Busy",
    "503",
    "500",
    "502",
    "504",
}

CREDENTIALS_HINT = (
    "check the credentials: accessKey/secretKey in the bucket URI, or "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: at most `max_attempts` tries in total."""

    max_attempts: int = 4
    backoff_base_ms: int = 50
    backoff_max_ms: int = 2000

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 100:
            raise ValueError(f"max_attempts must be in 1..100, got {self.max_attempts}")
        if self.backoff_base_ms < 0 or self.backoff_max_ms < 0:
            raise ValueError("backoff times must be >= 0")

    def backoff_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep after failed attempt number `attempt` (1-based)."""
        exponent = min(max(attempt - 1, 0), 30)
        ceiling_ms = min(self.backoff_max_ms, self.backoff_base_ms * (2**exponent))
        r = (rng or random).random()
        return (ceiling_ms / 2 + r * ceiling_ms / 2) / 1000.0


@dataclass(frozen=True)
class Failure:
    """Classification of one failed attempt."""

    status: str  # metrics label (see metrics.STATUSES)
    retryable: bool
    error_type: type[ObjectStoreError]
    detail: str  # readable, no secrets


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def classify(exc: BaseException) -> Failure:
    """Map a botocore/urllib3 exception to a `Failure`."""
    if isinstance(exc, ClientError):
        status, code = http_status(exc), error_code(exc)
        message = str(exc.response.get("Error", {}).get("Message") or "").strip()
        label = "" if not code or code == str(status) else f" {code}"
        detail = f"HTTP {status or '?'}{label}" + (f": {message}" if message else "")
        if code == "NoSuchBucket":
            return Failure("client_error", False, ObjectStoreError, detail)
        if status == 404 or code in _NOT_FOUND_CODES:
            return Failure("not_found", False, ObjectNotFoundError, detail)
        if status == 412 or code == "PreconditionFailed":
            return Failure("precondition_failed", False, PreconditionFailedError, detail)
        if status == 416 or code == "InvalidRange":
            return Failure("invalid_range", False, InvalidRangeError, detail)
        if status == 403 or code in _ACCESS_CODES:
            return Failure(
                "access_denied", False, AccessDeniedError, f"{detail} - {CREDENTIALS_HINT}"
            )
        if status >= 500 or status == 429 or code in _RETRY_CODES:
            return Failure("server_error", True, ObjectStoreUnavailableError, detail)
        return Failure("client_error", False, ObjectStoreError, detail)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return Failure("access_denied", False, AccessDeniedError, f"{exc} - {CREDENTIALS_HINT}")
    if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)):
        return Failure("timeout", True, ObjectStoreUnavailableError, str(exc))
    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        return Failure(
            "connection_error", True, ObjectStoreUnavailableError, str(exc) + _os_reason(exc)
        )
    if isinstance(exc, (TimeoutError, ConnectionError)):  # raw socket errors from a body read
        return Failure(
            "connection_error", True, ObjectStoreUnavailableError, f"{type(exc).__name__}: {exc}"
        )
    if isinstance(exc, BotoCoreError):
        return Failure("client_error", False, ObjectStoreError, str(exc))
    return Failure("client_error", False, ObjectStoreError, f"{type(exc).__name__}: {exc}")


def _os_reason(exc: BaseException) -> str:
    """' (Connection refused)' etc. from the wrapped socket error, if there is one."""
    cause = getattr(exc, "kwargs", {}).get("error")
    match = re.search(r"\[Errno -?\d+\] ([^'\"\)]+)", str(cause)) if cause else None
    return f" ({match.group(1).strip()})" if match else ""


def unavailable(
    what: str, attempts: int, failure: Failure, *, op: str, bucket_id: int, key: str | None
) -> ObjectStoreUnavailableError:
    """The error raised once the retries are spent."""
    plural = "attempt" if attempts == 1 else "attempts"
    return ObjectStoreUnavailableError(
        f"{what} failed after {attempts} {plural}: {failure.detail}",
        op=op,
        bucket_id=bucket_id,
        key=key,
    )


def final_error(
    what: str, failure: Failure, *, op: str, bucket_id: int, key: str | None
) -> ObjectStoreError:
    """The error raised for a failure that is not retried."""
    return failure.error_type(f"{what}: {failure.detail}", op=op, bucket_id=bucket_id, key=key)
