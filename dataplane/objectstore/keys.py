"""Object keys: where an object id lives in a bucket.

Scheme (version 0)::

    data/<hash8>/<object_id>        e.g. object 42 -> "data/5f9f1c2a/42"

* `data/` is the root of all stream data, so other roots (e.g. `ops/`, `wal/`) can share a
  bucket without colliding;
* `<hash8>` is the CRC-32 (zlib polynomial) of the object id as 8 big-endian bytes, in 8
  lower-case hex digits. Consecutive ids get unrelated prefixes, which spreads objects over
  the store's key-range partitions the way AutoMQ's hash prefix does (S3 scales request rates
  per prefix);
* `<object_id>` is the decimal id, 0 <= id < 2**63 (the controller allocates them).

The key is a pure function of the id, so any node (or a Spark executor) finds an object from
its metadata without listing; the bucket comes from the object's bucket id.
"""

from __future__ import annotations

import re
import zlib

OBJECT_KEY_ROOT = "data"
MAX_OBJECT_ID = 2**63 - 1
_KEY_RE = re.compile(r"^data/([0-9a-f]{8})/(0|[1-9][0-9]{0,18})$")


def _hash_prefix(object_id: int) -> str:
    return "%08x" % zlib.crc32(object_id.to_bytes(8, "big"))


def object_key(object_id: int) -> str:
    """The key of object `object_id` (see the module docstring)."""
    if isinstance(object_id, bool) or not isinstance(object_id, int):
        raise TypeError(f"object_id must be an int, got {type(object_id).__name__}")
    if not 0 <= object_id <= MAX_OBJECT_ID:
        raise ValueError(f"object_id must be in 0..2**63-1, got {object_id}")
    return f"{OBJECT_KEY_ROOT}/{_hash_prefix(object_id)}/{object_id}"


def object_id_from_key(key: str) -> int:
    """Inverse of `object_key`; ValueError if `key` is not a well-formed object key."""
    match = _KEY_RE.match(key)
    if match is None:
        raise ValueError(f"not an object key: {key[:100]!r}")
    object_id = int(match.group(2))
    if object_id > MAX_OBJECT_ID or match.group(1) != _hash_prefix(object_id):
        raise ValueError(f"not an object key (hash prefix mismatch): {key[:100]!r}")
    return object_id
