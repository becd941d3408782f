"""ObjectStorage: boto3 behind one small interface, several buckets addressed by id.

    store = ObjectStorage(parse_bucket_uris("0@s3://main?...,1@s3://failover?..."))
    store.put_object(1, object_key(42), data, if_none_match=True)
    block = store.get_range(1, object_key(42), 0, 512 * 1024)
    fut = store.get_range_async(1, object_key(42), 512 * 1024, 1024 * 1024)

What it adds to boto3:

* one lazily created client per bucket (path-style by default, our timeouts, botocore's own
  retries off, connection pool sized to our thread pool plus headroom for sync callers;
  see `clients.py`), tunables in `ObjectStorageConfig` (`store_config.py`);
* bounded retries with backoff for timeouts, connection errors and 5xx/throttling (see
  `retry.py`); 404/412/403/416 map to typed errors at once (see `errors.py`);
* a bounded thread pool for the `*_async` variants, and a cap on pending async requests;
* range-read merging for `get_range_async` (see `merging.py`); sync `get_range` reads
  directly in the calling thread and is never delayed by the merge window;
* `get_range_async`'s GETs bypass botocore where they can (`ranged_get.py`: plain http
  endpoints with static credentials, `ObjectStorageConfig.lean_range_gets`): the catch-up
  read's GETs at a third of the CPU; PUTs too (`lean_put.py`, `lean_puts`, unsigned payloads
  only): ~0.4x the CPU per GB uploaded;
* priority bandwidth limits for reads and writes (see `limiter.py`), and a pool that runs
  the `*_async` requests by the same priorities, keeping a quarter of its workers for
  `PRODUCE` work (uploads, WAL PUTs): a catch-up's queued or throttled GETs never hold every
  worker (see `priority_pool.py`);
* Prometheus metrics per attempt (see `metrics.py`).

A ranged read returns exactly `end_exclusive - start` bytes or raises: a range past the end
of the object raises InvalidRangeError instead of returning a short buffer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from .body import ObjectBody
from .bucket_uri import BucketURI, parse_bucket_uris
from .clients import BucketClients, ClientFactory, buckets_by_id
from .errors import InvalidRangeError, ObjectStoreError, ObjectStoreUnavailableError
from .health import WriteHealthTracker
from .lean_put import LeanPutClient
from .limiter import BandwidthLimiter, Priority
from .merging import RangeMerger, ReadBatch
from .metrics import ObjectStoreMetrics, default_metrics
from .priority_pool import PriorityThreadPool
from .ranged_get import RangedGetClient
from .retry import RetryPolicy, classify, final_error, http_status, unavailable
from .store_config import ObjectStorageConfig

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_KEY_BYTES = 1024  # S3's limit for a key
LIST_PAGE_KEYS = 1000

FAIL_FAST_AFTER_MS = 3_000  # reads of a bucket whose writes fail this long fail at once


class ObjectStorage:
    """Thread-safe access to the cluster's buckets; see the module docstring.

    `buckets` is a bucket-URI string or parsed `BucketURI`s. Configuration comes from
    `config` and/or keyword overrides of `ObjectStorageConfig` fields, e.g.
    `ObjectStorage(uris, connect_timeout_ms=500, merge_window_ms=0)`.
    `client_factory(bucket, botocore_config)` replaces boto3 client creation (tests, tools).
    Use as a context manager or call `close()`.
    """

    def __init__(
        self,
        buckets: str | Sequence[BucketURI],
        config: ObjectStorageConfig | None = None,
        *,
        client_factory: ClientFactory | None = None,
        metrics: ObjectStoreMetrics | None = None,
        write_health: WriteHealthTracker | None = None,
        **overrides: Any,
    ) -> None:
        if isinstance(buckets, str):
            buckets = parse_bucket_uris(buckets)
        by_id = buckets_by_id(buckets)
        base = config or ObjectStorageConfig()
        self.config = (
            ObjectStorageConfig(**{**base.model_dump(), **overrides}) if overrides else base
        )
        cfg = self.config
        self._clients = BucketClients(by_id, cfg, client_factory)
        self.metrics = metrics or default_metrics()
        # every put's outcome per bucket (object-storage failover detection); may be shared
        self.write_health = write_health or WriteHealthTracker()
        self.retry_policy = RetryPolicy(cfg.max_attempts, cfg.backoff_base_ms, cfg.backoff_max_ms)
        self.read_limiter = BandwidthLimiter(cfg.read_bandwidth_bytes_per_s)
        self.write_limiter = BandwidthLimiter(cfg.write_bandwidth_bytes_per_s)
        # by priority, with workers kept for uploads (priority_pool.py)
        self._executor = PriorityThreadPool(cfg.max_concurrency)
        self._pending = threading.BoundedSemaphore(cfg.max_pending_requests)
        self._merger = RangeMerger(
            self._submit_batch,
            window_s=cfg.merge_window_ms / 1000,
            gap_bytes=cfg.merge_gap_bytes,
            max_bytes=cfg.merge_max_bytes,
            max_open_batches=cfg.merge_max_open_batches,
        )
        # the lean clients where they serve a bucket: async GETs, and PUTs of unsigned
        # payloads (a client factory given, e.g. by tests, keeps every request on botocore)
        lean = client_factory is None
        timeouts_s = (cfg.connect_timeout_ms / 1000, cfg.read_timeout_ms / 1000)
        self._ranged_gets = (
            RangedGetClient(by_id, *timeouts_s, max_idle_per_bucket=cfg.max_concurrency)
            if lean and cfg.lean_range_gets
            else None
        )
        self._lean_puts = (
            LeanPutClient(by_id, *timeouts_s, max_idle_per_bucket=cfg.max_concurrency)
            if lean and cfg.lean_puts and not cfg.sign_payloads
            else None
        )
        self._closed = False  # no new requests accepted

    # -- buckets and clients ------------------------------------------------------------------
    @property
    def bucket_ids(self) -> list[int]:
        """The configured bucket ids, ascending."""
        return self._clients.bucket_ids

    def bucket(self, bucket_id: int) -> BucketURI:
        """The BucketURI of `bucket_id`; ObjectStoreError if it is not configured."""
        return self._clients.bucket(bucket_id)

    def boto3_client(self, bucket_id: int) -> Any:
        """The (lazily created) boto3 client of a bucket, e.g. to register botocore events."""
        return self._clients.client(bucket_id, probe=False)

    # -- retries ------------------------------------------------------------------------------
    def _call(
        self,
        op: str,
        bucket_id: int,
        key: str | None,
        what: str,
        attempt_fn: Callable[[Any, int], T],
        n_bytes: Callable[[T], int] | None = None,
    ) -> T:
        """Run `attempt_fn(client, attempt_no)` with the retry policy; map failures."""
        client = self._clients.client(bucket_id, probe=False)
        failing_ms = 0 if op == "put" else self.write_health.failing_for_ms(bucket_id)
        if failing_ms >= FAIL_FAST_AFTER_MS:
            # a bucket every write fails on (object-storage failover): reads fail at once
            # with a retriable error instead of each waiting out its timeouts; writes (and
            # the broker's probes) keep trying, so reads resume once it heals
            raise ObjectStoreUnavailableError(
                f"{what}: bucket {bucket_id} is unavailable (writes failing for "
                f"{failing_ms} ms); retry later",
                op=op,
                bucket_id=bucket_id,
                key=key,
            )
        policy = self.retry_policy
        for attempt in range(1, policy.max_attempts + 1):
            t0 = time.monotonic()
            try:
                result = attempt_fn(client, attempt)
            except ObjectStoreError:
                raise  # already final (raised by our own checks inside the attempt)
            except Exception as exc:
                failure = classify(exc)
                self.metrics.observe(op, bucket_id, failure.status, time.monotonic() - t0)
                if not failure.retryable:
                    raise final_error(what, failure, op=op, bucket_id=bucket_id, key=key) from exc
                if attempt >= policy.max_attempts:
                    log.warning(
                        "%s: giving up after %d attempts: %s", what, attempt, failure.detail
                    )
                    raise unavailable(
                        what, attempt, failure, op=op, bucket_id=bucket_id, key=key
                    ) from exc
                delay = policy.backoff_s(attempt)
                log.debug(
                    "%s: attempt %d failed (%s); retrying in %.0f ms",
                    what,
                    attempt,
                    failure.detail,
                    delay * 1000,
                )
                time.sleep(delay)
            else:
                size = n_bytes(result) if n_bytes is not None else 0
                self.metrics.observe(op, bucket_id, "ok", time.monotonic() - t0, size)
                return result
        raise AssertionError("unreachable")  # the loop always returns or raises

    def _key(self, bucket_id: int, key: str) -> str:
        """The stored key: the bucket's key prefix (`prefix=` in its URI) and `key`."""
        return self.bucket(bucket_id).key_prefix + key

    def _where(self, bucket_id: int, key: str) -> str:
        return f"{self.bucket(bucket_id).describe()} key {key!r}"

    # -- writes -------------------------------------------------------------------------------
    def put_object(
        self,
        bucket_id: int,
        key: str,
        data: bytes | ObjectBody,
        if_none_match: bool = False,
        priority: Priority = Priority.PRODUCE,
    ) -> None:
        """Write `data` under `key`. An `ObjectBody` is sent buffer by buffer, never joined
        (its buffers must not change until the put is over); each attempt reads it afresh.

        With `if_none_match` the write succeeds only if the key does not exist yet
        (PreconditionFailedError otherwise). A retry after an ambiguous failure (timeout,
        5xx) that then meets 412 checks whether the object holds exactly `data` - i.e. our
        own earlier attempt landed - and then counts as success.
        """
        self._check_open()
        self._put_object(bucket_id, self._key(bucket_id, key), data, if_none_match, priority)

    def _put_object(
        self,
        bucket_id: int,
        key: str,
        data: bytes | ObjectBody,
        if_none_match: bool,
        priority: Priority,
    ) -> None:
        _check_key(key)
        if not isinstance(data, (bytes, ObjectBody)):
            data = bytes(data)  # a caller's mutable buffer: copy it before an async put
        size = len(data)
        if size > self.config.max_object_bytes:
            raise ObjectStoreError(
                f"object of {size} bytes exceeds max_object_bytes={self.config.max_object_bytes}",
                op="put",
                bucket_id=bucket_id,
                key=key,
            )
        bucket = self.bucket(bucket_id)
        self._throttle(self.write_limiter, size, priority, "put", bucket_id, key)
        kwargs: dict[str, Any] = {"Bucket": bucket.bucket, "Key": key}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"

        lean = self._lean_puts if self._lean_puts and self._lean_puts.usable(bucket_id) else None

        def attempt(client: Any, attempt_no: int) -> None:
            try:
                if lean is not None:
                    lean.put(bucket_id, key, data, if_none_match)
                else:
                    # every attempt sends the body from its first byte (a fresh reader)
                    body = data.reader() if isinstance(data, ObjectBody) else data
                    client.put_object(**kwargs, Body=body)
            except ClientError as exc:
                if (
                    if_none_match
                    and attempt_no > 1
                    and http_status(exc) == 412
                    and self._holds_exactly(client, bucket.bucket, key, data)
                ):
                    log.info(
                        "put %s: 412 on retry, but the object holds our bytes",
                        self._where(bucket_id, key),
                    )
                    return
                raise

        t0 = time.monotonic()
        try:
            self._call(
                "put",
                bucket_id,
                key,
                f"put {self._where(bucket_id, key)}",
                attempt,
                lambda _: size,
            )
        except ObjectStoreError as exc:
            self.write_health.record_failure(bucket_id, exc, started_s=t0)
            raise
        self.write_health.record_ok(bucket_id, time.monotonic() - t0)

    def put_object_async(
        self,
        bucket_id: int,
        key: str,
        data: bytes | ObjectBody,
        if_none_match: bool = False,
        priority: Priority = Priority.PRODUCE,
    ) -> Future:
        """`put_object` on the pool; the future's result is None."""
        _check_key(key)
        key = self._key(bucket_id, key)
        return self._submit(
            priority, self._put_object, bucket_id, key, data, if_none_match, priority
        )

    @staticmethod
    def _holds_exactly(client: Any, bucket: str, key: str, data: bytes | ObjectBody) -> bool:
        head = client.head_object(Bucket=bucket, Key=key)
        if int(head.get("ContentLength", -1)) != len(data):
            return False
        if isinstance(data, bytes):
            ours = ObjectBody([data])
        else:
            ours = data
        if str(head.get("ETag", "")).strip('"') == ours.md5_hex():
            return True
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return ours.equals(body.read())
        finally:
            body.close()

    def delete_objects(self, bucket_id: int, keys: Iterable[str]) -> int:
        """Delete `keys` (missing keys are fine) in batches of up to 1000; returns the count.

        Raises the typed error of the first per-key failure S3 reports.
        """
        self._check_open()
        bucket = self.bucket(bucket_id)
        key_list = list(keys)
        for k in key_list:
            _check_key(k)
        key_list = [bucket.key_prefix + k for k in key_list]
        step = self.config.delete_batch_keys
        for i in range(0, len(key_list), step):
            batch = key_list[i : i + step]
            what = f"delete of {len(batch)} keys (first {batch[0]!r}) in {bucket.describe()}"

            def attempt(client: Any, _: int, batch: list[str] = batch) -> dict:
                return client.delete_objects(
                    Bucket=bucket.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )

            response = self._call("delete", bucket_id, batch[0], what, attempt)
            errors = [e for e in response.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                fake = ClientError(
                    {
                        "Error": {
                            "Code": first.get("Code", ""),
                            "Message": first.get("Message", ""),
                        },
                        "ResponseMetadata": {"HTTPStatusCode": 0},
                    },
                    "DeleteObjects",
                )
                failure = classify(fake)
                sample = ", ".join(f"{e.get('Key')!r}: {e.get('Code')}" for e in errors[:3])
                raise failure.error_type(
                    f"{what}: {len(errors)} keys not deleted ({sample}) - {failure.detail}",
                    op="delete",
                    bucket_id=bucket_id,
                    key=first.get("Key"),
                )
        return len(key_list)

    # -- reads --------------------------------------------------------------------------------
    def get_range(
        self,
        bucket_id: int,
        key: str,
        start: int,
        end_exclusive: int,
        priority: Priority = Priority.CATCH_UP,
    ) -> bytes:
        """Bytes [start, end_exclusive) of the object, read in the calling thread.

        Returns exactly `end_exclusive - start` bytes; InvalidRangeError if the object is
        shorter, ObjectNotFoundError if it does not exist. Sent without botocore where
        `ranged_get.py` serves the bucket (a catch-up's object index reads: ~2.5 ms of CPU
        each through botocore, ~0.1 s per GB of a catch-up over objects of 10-40 MiB),
        the body copied out of its pooled buffer.
        """
        self._check_open()
        data = self._get_range(
            bucket_id, self._key(bucket_id, key), start, end_exclusive, priority, as_view=True
        )
        return data if isinstance(data, bytes) else data.tobytes()

    def _get_range(
        self,
        bucket_id: int,
        key: str,
        start: int,
        end_exclusive: int,
        priority: Priority,
        as_view: bool = False,
    ) -> bytes | memoryview:
        _check_key(key)
        self._check_range(start, end_exclusive, bucket_id, key)
        if end_exclusive == start:
            return b""
        data = self._read_span(bucket_id, key, start, end_exclusive, priority, as_view)
        if len(data) < end_exclusive - start:
            raise InvalidRangeError(
                f"get {self._where(bucket_id, key)}: range [{start}, {end_exclusive}) runs past "
                f"the end of the object ({start + len(data)} bytes)",
                op="get",
                bucket_id=bucket_id,
                key=key,
            )
        return data

    def get_range_async(
        self,
        bucket_id: int,
        key: str,
        start: int,
        end_exclusive: int,
        priority: Priority = Priority.CATCH_UP,
        max_gap_bytes: int | None = None,
        merge: bool = True,
    ) -> Future:
        """`get_range` on the pool; concurrent nearby ranges of one object share one GET.

        Ranges of at most `merge_max_bytes` wait up to `merge_window_ms` for neighbours
        (within `merge_gap_bytes`, or `max_gap_bytes` if smaller: 0 merges only touching
        or overlapping ranges, for callers that already hold the bytes in between) before
        one GET serves them all. `merge=False` sends the GET at once (a caller reading a
        long range in pieces, several in flight). The future's result is `bytes`, or a
        read-only memoryview of a body that never changes (a merged GET's, or one read by
        `ranged_get.py`).
        """
        _check_key(key)
        self._check_range(start, end_exclusive, bucket_id, key)
        key = self._key(bucket_id, key)
        if end_exclusive == start:
            done: Future = Future()
            done.set_result(b"")
            return done
        if not merge or not self._merger.mergeable(start, end_exclusive):
            return self._submit(
                priority, self._get_range, bucket_id, key, start, end_exclusive, priority, True
            )
        self._check_open()
        self._acquire_pending()
        try:
            future = self._merger.submit(
                bucket_id, key, start, end_exclusive, priority, max_gap_bytes
            )
        except BaseException:
            self._pending.release()
            raise
        future.add_done_callback(lambda _: self._pending.release())
        return future

    def get_object(self, bucket_id: int, key: str, priority: Priority = Priority.CATCH_UP) -> bytes:
        """The whole object (at most `max_object_bytes`)."""
        self._check_open()
        _check_key(key)
        bucket = self.bucket(bucket_id)
        key = bucket.key_prefix + key
        limit = self.config.max_object_bytes

        def attempt(client: Any, _: int) -> bytes:
            resp = client.get_object(Bucket=bucket.bucket, Key=key)
            body = resp["Body"]
            try:
                size = int(resp.get("ContentLength", 0))
                if size > limit:
                    raise ObjectStoreError(
                        f"get {self._where(bucket_id, key)}: object of {size} bytes exceeds "
                        f"max_object_bytes={limit}; read it in ranges",
                        op="get",
                        bucket_id=bucket_id,
                        key=key,
                    )
                return body.read()
            finally:
                body.close()

        data = self._call("get", bucket_id, key, f"get {self._where(bucket_id, key)}", attempt, len)
        # the size is only known now: pay for it afterwards (the limiter allows debt)
        self._throttle(self.read_limiter, len(data), priority, "get", bucket_id, key)
        return data

    def head_object(self, bucket_id: int, key: str) -> int:
        """Size of the object in bytes; ObjectNotFoundError if it does not exist."""
        self._check_open()
        _check_key(key)
        bucket = self.bucket(bucket_id)
        key = bucket.key_prefix + key

        def attempt(client: Any, _: int) -> int:
            return int(client.head_object(Bucket=bucket.bucket, Key=key)["ContentLength"])

        return self._call("head", bucket_id, key, f"head {self._where(bucket_id, key)}", attempt)

    def iter_keys(self, bucket_id: int, prefix: str = "", start_after: str = "") -> Iterator[str]:
        """All keys under `prefix` (only those after `start_after`, S3's StartAfter, when
        given), page by page (1000 per request, each page retried)."""
        self._check_open()
        bucket = self.bucket(bucket_id)
        token: str | None = None
        own = len(bucket.key_prefix)  # the bucket's key prefix: not part of the keys yielded
        while True:
            kwargs: dict[str, Any] = {
                "Bucket": bucket.bucket,
                "Prefix": bucket.key_prefix + prefix,
                "MaxKeys": LIST_PAGE_KEYS,
            }
            if start_after:
                kwargs["StartAfter"] = bucket.key_prefix + start_after
            if token:
                kwargs["ContinuationToken"] = token

            def attempt(client: Any, _: int, kwargs: dict = kwargs) -> dict:
                return client.list_objects_v2(**kwargs)

            page = self._call(
                "list", bucket_id, prefix, f"list {bucket.describe()} prefix {prefix!r}", attempt
            )
            for item in page.get("Contents", []):
                yield item["Key"][own:]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def list_keys(self, bucket_id: int, prefix: str = "", limit: int = 100_000) -> list[str]:
        """Up to `limit` keys under `prefix`, in the store's (lexicographic) order."""
        if limit <= 0:
            raise ValueError(f"limit must be > 0, got {limit}")
        out: list[str] = []
        for key in self.iter_keys(bucket_id, prefix):
            out.append(key)
            if len(out) >= limit:
                break
        return out

    def check_reachable(self, bucket_id: int) -> float:
        """HEAD the bucket once with `check_timeout_ms`; returns the latency in ms.

        Raises ObjectStoreUnavailableError whose message says why (refused, timeout, access
        denied, no such bucket); the specific error is chained as `__cause__`.
        """
        self._check_open()
        bucket = self.bucket(bucket_id)
        client = self._clients.client(bucket_id, probe=True)
        t0 = time.monotonic()
        try:
            client.head_bucket(Bucket=bucket.bucket)
        except Exception as exc:
            failure = classify(exc)
            if isinstance(exc, ClientError) and http_status(exc) == 404:
                failure = type(failure)(
                    "client_error", False, ObjectStoreError, f"{failure.detail} (no such bucket)"
                )
            self.metrics.observe("head_bucket", bucket_id, failure.status, time.monotonic() - t0)
            raise ObjectStoreUnavailableError(
                f"{bucket.describe()} is not usable: {failure.detail}",
                op="head_bucket",
                bucket_id=bucket_id,
            ) from final_error(
                f"head {bucket.describe()}",
                failure,
                op="head_bucket",
                bucket_id=bucket_id,
                key=None,
            )
        elapsed = time.monotonic() - t0
        self.metrics.observe("head_bucket", bucket_id, "ok", elapsed)
        return elapsed * 1000

    def _read_span(
        self,
        bucket_id: int,
        key: str,
        start: int,
        end_exclusive: int,
        priority: Priority,
        as_view: bool = False,
    ) -> bytes | memoryview:
        """GET bytes [start, end_exclusive); may return fewer if the object ends earlier.
        `as_view`: a read-only memoryview will do (then without botocore where it can)."""
        bucket = self.bucket(bucket_id)
        expected = end_exclusive - start
        if expected > self.config.max_object_bytes:
            raise ObjectStoreError(
                f"range of {expected} bytes exceeds max_object_bytes",
                op="get",
                bucket_id=bucket_id,
                key=key,
            )
        self._throttle(self.read_limiter, expected, priority, "get", bucket_id, key)

        ranged = self._ranged_gets

        def lean_attempt(client: Any, _: int) -> bytes | memoryview:
            assert ranged is not None
            return ranged.get(bucket_id, key, start, end_exclusive)

        def boto_attempt(client: Any, _: int) -> bytes | memoryview:
            resp = client.get_object(
                Bucket=bucket.bucket, Key=key, Range=f"bytes={start}-{end_exclusive - 1}"
            )
            body = resp["Body"]
            try:
                data = body.read()
            finally:
                body.close()
            if not resp.get("ContentRange") and len(data) > expected:
                data = data[start:end_exclusive]  # the server ignored Range: whole object
            return data

        attempt = (
            lean_attempt
            if as_view and ranged is not None and ranged.usable(bucket_id)
            else boto_attempt
        )
        data = self._call(
            "get",
            bucket_id,
            key,
            f"get {self._where(bucket_id, key)} range [{start}, {end_exclusive})",
            attempt,
            len,
        )
        if len(data) > expected:
            raise ObjectStoreError(
                f"get {self._where(bucket_id, key)}: asked for {expected} bytes, got {len(data)}",
                op="get",
                bucket_id=bucket_id,
                key=key,
            )
        return data

    # -- pool, merging, throttling --------------------------------------------------------------
    def _submit_batch(self, batch: ReadBatch) -> None:
        """RangeMerger callback: run one GET for a flushed batch on the pool."""
        self._executor.submit(batch.priority, self._run_batch, batch)

    def _run_batch(self, batch: ReadBatch) -> None:
        members = batch.claim()
        if not members:
            return
        start, end = ReadBatch.span_of(members)
        try:
            data = self._read_span(batch.bucket_id, batch.key, start, end, batch.priority, True)
        except BaseException as exc:
            ReadBatch.fail(members, exc)
            return
        if len(members) > 1:
            self.metrics.count_merged(batch.bucket_id, len(members))
        batch.deliver(members, start, data)

    def _submit(self, priority: Priority, fn: Callable[..., T], *args: Any) -> Future:
        self._check_open()
        self._acquire_pending()
        try:
            future = self._executor.submit(priority, fn, *args)
        except RuntimeError as exc:  # shut down concurrently
            self._pending.release()
            raise ObjectStoreError("object storage is closed") from exc
        future.add_done_callback(lambda _: self._pending.release())
        return future

    def _acquire_pending(self) -> None:
        if not self._pending.acquire(blocking=False):
            raise ObjectStoreError(
                f"too many pending object store requests (limit "
                f"{self.config.max_pending_requests}); back off and retry"
            )

    def _throttle(
        self,
        limiter: BandwidthLimiter,
        n_bytes: int,
        priority: Priority,
        op: str,
        bucket_id: int,
        key: str,
    ) -> None:
        try:
            limiter.acquire(n_bytes, priority, self.config.throttle_timeout_ms / 1000)
        except ObjectStoreError as exc:
            exc.op, exc.bucket_id, exc.key = op, bucket_id, key
            raise

    # -- lifecycle ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ObjectStoreError("object storage is closed")

    @staticmethod
    def _check_range(start: int, end_exclusive: int, bucket_id: int, key: str) -> None:
        if start < 0 or end_exclusive < start:
            raise ValueError(
                f"invalid range [{start}, {end_exclusive}) for {key!r} in bucket "
                f"{bucket_id}: need 0 <= start <= end_exclusive"
            )

    def close(self) -> None:
        """Flush pending merged reads, wait for the pool, release the clients (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._merger.close()
        self._executor.shutdown(wait=True)
        self._clients.close()
        if self._ranged_gets is not None:
            self._ranged_gets.close()
        if self._lean_puts is not None:
            self._lean_puts.close()

    def __enter__(self) -> ObjectStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"object key is longer than {MAX_KEY_BYTES} bytes: {key[:60]!r}...")
