"""Errors raised by the object-store layer.

Everything derives from `ObjectStoreError`, so a caller that only wants "the object store
failed" catches that one class. The subclasses say what the caller can do about it:

* `ObjectNotFoundError`        - the key does not exist (404); never retried.
* `PreconditionFailedError`    - a conditional write lost (`If-None-Match: *` found an object).
* `ObjectStoreUnavailableError`- timeouts, refused connections, 5xx/throttling, still failing
                                 after the bounded retries; the store may come back later.
* `AccessDeniedError`          - wrong or missing credentials / permissions; retrying is useless.
* `InvalidRangeError`          - a ranged read reaches beyond the end of the object.
* `BandwidthLimitTimeoutError` - the bandwidth limiter did not grant the bytes in time.

Messages name the operation, the bucket id, the bucket and the key, and never credentials.
"""

from __future__ import annotations


class ObjectStoreError(Exception):
    """Base class of every object-store failure.

    Attributes are optional context for logs and metrics: `op` (put/get/head/...),
    `bucket_id` and `key`.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        bucket_id: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.op = op
        self.bucket_id = bucket_id
        self.key = key


class ObjectNotFoundError(ObjectStoreError):
    """The object does not exist (HTTP 404 / NoSuchKey).

    A missing *bucket* (NoSuchBucket) is a configuration error and raises the base class, so
    it is never mistaken for a deleted object; HEAD cannot tell the two apart (bare 404).
    """


class PreconditionFailedError(ObjectStoreError):
    """A conditional request failed (HTTP 412), e.g. `If-None-Match: *` on an existing key."""


class ObjectStoreUnavailableError(ObjectStoreError):
    """The store did not answer usefully: timeouts, connection errors or 5xx after retries."""


class AccessDeniedError(ObjectStoreError):
    """HTTP 403 or no credentials: the access key, secret or permissions are wrong."""


class InvalidRangeError(ObjectStoreError):
    """A ranged read asked for bytes beyond the end of the object (HTTP 416 or a short body)."""


class BandwidthLimitTimeoutError(ObjectStoreError):
    """The bandwidth limiter could not grant the requested bytes within the allowed wait."""
