"""Object storage for the data plane: S3 (boto3) behind one small interface.

A leaf package: it imports nothing else from this project, so controllers, brokers and Spark
jobs can all use it. Modules, one concept each:

* `body`       - `ObjectBody`: an object as a list of buffers, sent without joining
* `bucket_uri` - `0@s3://bucket?region=..&endpoint=..,1@s3://...` -> `BucketURI` models
* `errors`     - `ObjectStoreError` and its typed subclasses
* `health`     - write health per bucket (object-storage failover detection)
* `keys`       - `object_key(object_id)`: hash-prefixed keys under `data/`
* `limiter`    - `BandwidthLimiter` token bucket with `Priority` classes
* `merging`    - range-read merging (nearby concurrent reads share one GET)
* `retry`      - which failures are retried, backoff
* `metrics`    - Prometheus collectors (`automq_object_store_*`)
* `store_config` - `ObjectStorageConfig`: the tunables of `ObjectStorage`
* `clients`    - `BucketClients`: the buckets by id and their lazily created boto3 clients
* `store`      - `ObjectStorage`, tying the above to boto3
* `seaweed`    - the embedded SeaweedFS server (not imported here; import it explicitly)
"""

import importlib
from typing import TYPE_CHECKING, Any

from .body import ObjectBody, SendPace
from .bucket_uri import BucketURI, format_bucket_uris, parse_bucket_uris
from .errors import (
    AccessDeniedError,
    BandwidthLimitTimeoutError,
    InvalidRangeError,
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
    PreconditionFailedError,
)
from .health import BucketHealth, WriteHealthTracker
from .keys import object_id_from_key, object_key
from .limiter import BandwidthLimiter, Priority
from .store_config import ObjectStorageConfig

if TYPE_CHECKING:
    from .metrics import ObjectStoreMetrics, default_metrics
    from .store import ObjectStorage

# imported on first use: boto3 and prometheus_client take ~0.3 s to import, and the CLI's
# config models (`from dataplane.objectstore.seaweed import SeaweedConfig`) pass through here
_LAZY = {
    "ObjectStorage": ".store",
    "ObjectStoreMetrics": ".metrics",
    "default_metrics": ".metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError",
    "BandwidthLimitTimeoutError",
    "BandwidthLimiter",
    "BucketHealth",
    "BucketURI",
    "InvalidRangeError",
    "ObjectBody",
    "SendPace",
    "ObjectNotFoundError",
    "ObjectStorage",
    "ObjectStorageConfig",
    "ObjectStoreError",
    "ObjectStoreMetrics",
    "ObjectStoreUnavailableError",
    "PreconditionFailedError",
    "Priority",
    "WriteHealthTracker",
    "default_metrics",
    "format_bucket_uris",
    "object_id_from_key",
    "object_key",
    "parse_bucket_uris",
]
