"""The S3 clients of `ObjectStorage`: `BucketClients` holds the configured buckets by id and
each one's lazily created boto3 client (path-style by default, our timeouts, botocore's own
retries off, a connection pool sized to the thread pool plus headroom for sync callers), and
a second client with the short check timeouts for reachability probes.

`default_client_factory` builds the client class boto3.client("s3") builds, sharing one
botocore data loader per process; `without_expect_continue` drops botocore's
`Expect: 100-continue` from a client's PUTs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import botocore.handlers
import botocore.loaders
import botocore.session
from botocore.config import Config as BotoConfig

from .bucket_uri import BucketURI
from .errors import ObjectStoreError
from .store_config import ObjectStorageConfig

__all__ = [
    "BucketClients",
    "ClientFactory",
    "buckets_by_id",
    "default_client_factory",
    "without_expect_continue",
]

ClientFactory = Callable[[BucketURI, BotoConfig], Any]


_loader_lock = threading.Lock()
_shared_loader: botocore.loaders.Loader | None = None


def _loader() -> botocore.loaders.Loader:
    global _shared_loader
    with _loader_lock:
        if _shared_loader is None:
            _shared_loader = botocore.loaders.create_loader()
        return _shared_loader


def default_client_factory(bucket: BucketURI, config: BotoConfig) -> Any:
    """An S3 client for `bucket`, the same client class boto3.client("s3") builds.

    Each client gets its own botocore session (sessions are not thread-safe), but they share
    one data loader, so the S3 service model is parsed once per process: that makes a client
    ~20 ms instead of ~150 ms.
    """
    session = botocore.session.get_session()
    session.register_component("data_loader", _loader())
    return session.create_client(
        "s3",
        endpoint_url=bucket.endpoint,
        region_name=bucket.region,
        config=config,
        **bucket.credentials(),
    )


def without_expect_continue(client: Any) -> None:
    """No `Expect: 100-continue` on the client's PUTs. botocore adds it to every request
    whose body is file-like (our streamed uploads), then waits up to 1 s for the interim
    answer before sending the body: under load a 100 Continue arriving after that second
    was parsed as the headers of the real answer (urllib3 "Failed to parse headers"), and
    the PUT hung until its read timeout (30 s), stalling uploads and so the zone router's
    committed route epoch. The header buys nothing here: our PUTs are not redirected."""
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is not None:
        events.unregister("before-call.s3", botocore.handlers.add_expect_header)


def buckets_by_id(buckets: Sequence[BucketURI]) -> dict[int, BucketURI]:
    """The buckets by id; ValueError on none or on a duplicate id."""
    if not buckets:
        raise ValueError("ObjectStorage needs at least one bucket")
    by_id: dict[int, BucketURI] = {}
    for b in buckets:
        if b.bucket_id in by_id:
            raise ValueError(f"duplicate bucket id {b.bucket_id}")
        by_id[b.bucket_id] = b
    return by_id


class BucketClients:
    """The configured buckets and their lazily created S3 clients (thread-safe): one for
    requests, one with `check_timeout_ms` for probes. `close()` releases them all."""

    def __init__(
        self,
        buckets: dict[int, BucketURI],
        config: ObjectStorageConfig,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self._buckets = buckets
        self.config = config
        self._client_factory = client_factory or default_client_factory
        self._lock = threading.Lock()
        self._clients: dict[int, Any] = {}
        self._probe_clients: dict[int, Any] = {}
        self._shut_down = False  # clients released

    @property
    def bucket_ids(self) -> list[int]:
        """The configured bucket ids, ascending."""
        return sorted(self._buckets)

    def bucket(self, bucket_id: int) -> BucketURI:
        """The BucketURI of `bucket_id`; ObjectStoreError if it is not configured."""
        try:
            return self._buckets[bucket_id]
        except KeyError:
            raise ObjectStoreError(
                f"unknown bucket id {bucket_id!r}; configured ids: {self.bucket_ids}",
                bucket_id=bucket_id,
            ) from None

    def _botocore_config(self, bucket: BucketURI, connect_ms: int, read_ms: int) -> BotoConfig:
        return BotoConfig(
            region_name=bucket.region,
            connect_timeout=connect_ms / 1000,
            read_timeout=read_ms / 1000,
            retries={"total_max_attempts": 1, "mode": "standard"},  # we retry ourselves
            max_pool_connections=self.config.max_concurrency + self.config.extra_sync_connections,
            s3={
                "addressing_style": "path" if bucket.path_style else "virtual",
                "payload_signing_enabled": self.config.sign_payloads,
            },
            # S3-compatible stores differ in their support of the newer default checksums
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            tcp_keepalive=True,
            user_agent_extra="automqctl-objectstore",
        )

    def client(self, bucket_id: int, probe: bool) -> Any:
        """The bucket's client (`probe`: the one with the check timeouts), created on first use."""
        bucket = self.bucket(bucket_id)
        cache = self._probe_clients if probe else self._clients
        client = cache.get(bucket_id)
        if client is not None:
            return client
        with self._lock:
            if self._shut_down:
                raise ObjectStoreError("object storage is closed", bucket_id=bucket_id)
            client = cache.get(bucket_id)
            if client is None:
                cfg = self.config
                if probe:
                    bc = self._botocore_config(bucket, cfg.check_timeout_ms, cfg.check_timeout_ms)
                else:
                    bc = self._botocore_config(bucket, cfg.connect_timeout_ms, cfg.read_timeout_ms)
                client = self._client_factory(bucket, bc)
                without_expect_continue(client)
                cache[bucket_id] = client
            return client

    def close(self) -> None:
        """Release every client; no client is created afterwards."""
        with self._lock:
            self._shut_down = True
            clients = list(self._clients.values()) + list(self._probe_clients.values())
            self._clients.clear()
            self._probe_clients.clear()
        for client in clients:
            closer = getattr(client, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception:  # closing is best effort
                    pass
