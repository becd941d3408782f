"""Bucket URIs: which S3 buckets a cluster uses, each under a small integer id.

Format (AutoMQ's `s3.data.buckets`), entries separated by commas::

    0@s3://automq-main?region=us-east-1&endpoint=http://127.0.0.1:8333,1@s3://automq-failover?region=us-east-1

* `<id>@`   bucket id, 0..32767 (AutoMQ stores it as a short); unique within one list.
  Object metadata records the bucket id, and a read of that object goes to that bucket.
* `s3://<bucket>` the only scheme; the bucket name is required (no userinfo; a key prefix
  goes in the `prefix` parameter, not in the path).
* query parameters (names case-insensitive, each at most once):
    - `region`      signing region, default `us-east-1`;
    - `endpoint`    `http(s)://host[:port]` of an S3-compatible store; absent = AWS;
    - `pathStyle`   `true`/`false` (default true: path-style addressing suits MinIO,
                    SeaweedFS, Ceph; virtual-hosted style for AWS if you prefer);
    - `accessKey`, `secretKey`, `sessionToken` static credentials. Without them: env
                    AUTOMQ_S3_ACCESS_KEY_<id> / AUTOMQ_S3_SECRET_KEY_<id> (per bucket, e.g. a
                    failover bucket at another provider), then the standard chain (env
                    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profiles, roles);
    - `prefix`      a key prefix every object of the cluster is stored under (e.g.
                    `cluster-a/`; a `/` is added at the end): clusters sharing a bucket each
                    use their own (`automqctl cluster init/up --bucket-prefix`);
    - anything else is kept verbatim in `extra`, except names that look secret (containing
      secret/token/password/credential), which go to `secret_extra` as SecretStr.
  Values are percent-decoded; a comma inside a value must be written `%2C`.

Secrets are held as `pydantic.SecretStr`; `repr()`, `str()` and `to_string()` (redacted by
default) never show them, and parse errors never echo a query string.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

MAX_BUCKET_ID = 32767
MAX_BUCKETS = 256
MAX_URI_TEXT_CHARS = 64 * 1024
MAX_BUCKET_NAME_CHARS = 255
MAX_QUERY_PARAMS = 64
DEFAULT_REGION = "us-east-1"
REDACTED = "REDACTED"

_BUCKET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ID_RE = re.compile(r"^[0-9]{1,5}$")
_KEY_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*/$")
MAX_KEY_PREFIX_CHARS = 128
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
# query-parameter names (lower-cased) that map to model fields
_CREDENTIAL_PARAMS = {
    "accesskey": "access_key",
    "secretkey": "secret_key",
    "sessiontoken": "session_token",
}
# other parameters whose names look secret: kept as SecretStr, redacted when printed
_SECRET_NAME_RE = re.compile(r"secret|token|password|passwd|credential", re.IGNORECASE)


class BucketURI(BaseModel):
    """One bucket of the cluster, addressed by its id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket_id: int = Field(ge=0, le=MAX_BUCKET_ID)
    bucket: str = Field(min_length=1, max_length=MAX_BUCKET_NAME_CHARS)
    region: str = Field(default=DEFAULT_REGION, min_length=1, max_length=64)
    endpoint: str | None = None
    path_style: bool = True
    # every key of this bucket is stored under it ("" or "a/b/": segments of letters, digits,
    # '.', '-', '_')
    key_prefix: str = Field(default="", max_length=MAX_KEY_PREFIX_CHARS)
    access_key: SecretStr | None = None
    secret_key: SecretStr | None = None
    session_token: SecretStr | None = None
    extra: dict[str, str] = Field(default_factory=dict)
    secret_extra: dict[str, SecretStr] = Field(default_factory=dict)

    @field_validator("bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        if not _BUCKET_NAME_RE.match(value):
            raise ValueError(
                f"invalid bucket name {value[:80]!r}: use letters, digits, '.', '-' and '_'"
            )
        return value

    @field_validator("key_prefix")
    @classmethod
    def _check_key_prefix(cls, value: str) -> str:
        return normalize_key_prefix(value)

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must look like http(s)://host[:port], got {value[:120]!r}")
        if parts.username or parts.password:
            raise ValueError("endpoint must not contain credentials; use accessKey/secretKey")
        return value.rstrip("/")

    # ----------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, entry: str) -> BucketURI:
        """Parse one `<id>@s3://<bucket>?k=v&...` entry (see the module docstring)."""
        return _parse_entry(entry, position=1)

    def credentials(self) -> dict[str, str]:
        """boto3 client keyword arguments for the credentials to use.

        The URI's own accessKey/secretKey win; then env AUTOMQ_S3_ACCESS_KEY_<id> /
        AUTOMQ_S3_SECRET_KEY_<id>; otherwise env AWS_ACCESS_KEY_ID /
        AWS_SECRET_ACCESS_KEY (read now, so a test can set them); otherwise an empty dict and
        boto3's default chain (profiles, instance roles) decides.
        """
        if self.access_key is not None and self.secret_key is not None:
            out = {
                "aws_access_key_id": self.access_key.get_secret_value(),
                "aws_secret_access_key": self.secret_key.get_secret_value(),
            }
            if self.session_token is not None:
                out["aws_session_token"] = self.session_token.get_secret_value()
            return out
        own_key = os.environ.get(f"AUTOMQ_S3_ACCESS_KEY_{self.bucket_id}")
        own_secret = os.environ.get(f"AUTOMQ_S3_SECRET_KEY_{self.bucket_id}")
        if own_key and own_secret:  # this bucket's own credentials (object-storage failover)
            return {"aws_access_key_id": own_key, "aws_secret_access_key": own_secret}
        env_key = os.environ.get("AWS_ACCESS_KEY_ID")
        env_secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if env_key and env_secret:
            out = {"aws_access_key_id": env_key, "aws_secret_access_key": env_secret}
            token = os.environ.get("AWS_SESSION_TOKEN")
            if token:
                out["aws_session_token"] = token
            return out
        return {}

    def describe(self) -> str:
        """Short human label for messages: `bucket 1 (s3://automq-failover at http://...)`."""
        where = self.endpoint or f"AWS {self.region}"
        prefix = f"/{self.key_prefix}" if self.key_prefix else ""
        return f"bucket {self.bucket_id} (s3://{self.bucket}{prefix} at {where})"

    def to_string(self, redact: bool = True) -> str:
        """The URI text; with `redact` (default) secret values are replaced by REDACTED.

        `parse(to_string(redact=False))` gives an equal model.
        """
        params: list[tuple[str, str]] = [("region", self.region)]
        if self.endpoint is not None:
            params.append(("endpoint", self.endpoint))
        params.append(("pathStyle", "true" if self.path_style else "false"))
        if self.key_prefix:
            params.append(("prefix", self.key_prefix))
        params.extend(self.extra.items())
        for name, secret_value in self.secret_extra.items():
            params.append((name, REDACTED if redact else secret_value.get_secret_value()))
        for name, secret in (
            ("accessKey", self.access_key),
            ("secretKey", self.secret_key),
            ("sessionToken", self.session_token),
        ):
            if secret is not None:
                params.append((name, REDACTED if redact else secret.get_secret_value()))
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe=':/')}" for k, v in params)
        return f"{self.bucket_id}@s3://{self.bucket}?{query}"

    def __str__(self) -> str:
        return self.to_string(redact=True)

    def __repr__(self) -> str:
        return f"BucketURI({self.to_string(redact=True)!r})"


def parse_bucket_uris(text: str) -> list[BucketURI]:
    """Parse a comma-separated list of bucket URIs; ids must be unique.

    Raises ValueError with the entry's position and a redacted excerpt when malformed.
    """
    if not isinstance(text, str):
        raise ValueError(f"bucket URIs must be a string, got {type(text).__name__}")
    if len(text) > MAX_URI_TEXT_CHARS:
        raise ValueError(
            f"bucket URI list is {len(text)} characters; the limit is {MAX_URI_TEXT_CHARS}"
        )
    if not text.strip():
        raise ValueError("no bucket URIs given; expected e.g. '0@s3://bucket?region=us-east-1'")
    entries = text.split(",")
    if len(entries) > MAX_BUCKETS:
        raise ValueError(f"{len(entries)} bucket URIs given; the limit is {MAX_BUCKETS}")
    result: list[BucketURI] = []
    seen: dict[int, int] = {}
    for position, entry in enumerate(entries, start=1):
        uri = _parse_entry(entry, position)
        if uri.bucket_id in seen:
            raise ValueError(
                f"duplicate bucket id {uri.bucket_id}: entries {seen[uri.bucket_id]} "
                f"and {position} both use it"
            )
        seen[uri.bucket_id] = position
        result.append(uri)
    return result


def normalize_key_prefix(value: str) -> str:
    """A bucket key prefix as stored: "" or segments ending in '/' (one is added). Raises
    ValueError naming what is wrong (empty segments, '..', characters outside
    letters, digits, '.', '-', '_')."""
    if not value:
        return ""
    prefix = value if value.endswith("/") else value + "/"
    if len(prefix) > MAX_KEY_PREFIX_CHARS or not _KEY_PREFIX_RE.match(prefix):
        raise ValueError(
            f"invalid key prefix {value[:80]!r}: segments of letters, digits, '.', '-', '_' "
            f"separated by '/', at most {MAX_KEY_PREFIX_CHARS} characters"
        )
    if ".." in prefix.split("/"):
        raise ValueError(f"invalid key prefix {value[:80]!r}: '..' is not a segment")
    return prefix


def with_key_prefix(entry: str, prefix: str) -> str:
    """One bucket URI entry with `prefix=` added (`cluster init/up --bucket-prefix`): the
    entry's text is kept (its credentials too). ValueError for a bad prefix, or an entry
    that has another prefix already."""
    prefix = normalize_key_prefix(prefix)
    have = _parse_entry(entry, position=1).key_prefix
    if have == prefix or not prefix:
        return entry
    if have:
        raise ValueError(f"bucket URI already has the key prefix {have!r}, not {prefix!r}")
    return entry + ("&" if "?" in entry else "?") + f"prefix={quote(prefix, safe='/')}"


def format_bucket_uris(uris: list[BucketURI], redact: bool = True) -> str:
    """Inverse of `parse_bucket_uris` (redacted by default)."""
    return ",".join(u.to_string(redact=redact) for u in uris)


# --------------------------------------------------------------------------------------------
def _excerpt(entry: str) -> str:
    """A printable piece of an entry that cannot hold a secret: no query, no userinfo."""
    head = entry.split("?", 1)[0]
    scheme_end = head.find("://")
    if scheme_end >= 0:
        authority_start = scheme_end + 3
        at = head.rfind("@")
        if at > authority_start:
            head = head[:authority_start] + "***@" + head[at + 1 :]
    head = head.strip()
    return head if len(head) <= 80 else head[:77] + "..."


def _parse_bool(name: str, value: str, where: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{where}: {name} must be true or false, got {value[:20]!r}")


def _parse_entry(entry: str, position: int) -> BucketURI:
    entry = entry.strip()
    where = f"bucket URI entry {position}"
    if not entry:
        raise ValueError(f"{where} is empty (stray comma?)")
    excerpt = _excerpt(entry)
    where = f"{where} ({excerpt!r})"
    id_text, sep, rest = entry.partition("@")
    if not sep or "://" in id_text:
        raise ValueError(f"{where} has no bucket id; expected '<id>@s3://<bucket>?region=...'")
    id_text = id_text.strip()
    if not _ID_RE.match(id_text):
        raise ValueError(f"{where}: bucket id must be an integer 0..{MAX_BUCKET_ID}")
    bucket_id = int(id_text)
    if bucket_id > MAX_BUCKET_ID:
        raise ValueError(f"{where}: bucket id {bucket_id} is above {MAX_BUCKET_ID}")

    scheme, sep, after = rest.partition("://")
    if not sep:
        raise ValueError(f"{where}: expected 's3://<bucket>' after '{bucket_id}@'")
    if scheme.lower() != "s3":
        raise ValueError(f"{where}: unsupported scheme {scheme[:20]!r}; only 's3' is supported")
    authority_and_path, _, query = after.partition("?")
    if "#" in query:
        raise ValueError(f"{where}: '#' is not allowed; percent-encode it as %23")
    authority, slash, path = authority_and_path.partition("/")
    if "@" in authority:
        raise ValueError(
            f"{where}: credentials in the authority are not supported; "
            "use the accessKey/secretKey query parameters"
        )
    if not authority:
        raise ValueError(f"{where}: the bucket name is empty")
    if slash and path.strip("/"):
        raise ValueError(f"{where}: key prefixes after the bucket name are not supported")

    fields: dict[str, Any] = {"bucket_id": bucket_id, "bucket": authority}
    extra: dict[str, str] = {}
    secret_extra: dict[str, SecretStr] = {}
    seen: set[str] = set()
    pairs = parse_qsl(query, keep_blank_values=True) if query else []
    if len(pairs) > MAX_QUERY_PARAMS:
        raise ValueError(f"{where}: {len(pairs)} query parameters; the limit is {MAX_QUERY_PARAMS}")
    for name, value in pairs:
        lowered = name.lower()
        if not name:
            raise ValueError(f"{where}: a query parameter has an empty name")
        if lowered in seen:
            raise ValueError(f"{where}: query parameter {name!r} is given more than once")
        seen.add(lowered)
        if lowered == "region":
            if not value:
                raise ValueError(f"{where}: region is empty")
            fields["region"] = value
        elif lowered == "endpoint":
            fields["endpoint"] = value or None
        elif lowered == "prefix":
            fields["key_prefix"] = value
        elif lowered in ("pathstyle", "path_style"):
            fields["path_style"] = _parse_bool(name, value, where)
        elif lowered in _CREDENTIAL_PARAMS:
            if not value:
                raise ValueError(f"{where}: {name} is empty")
            fields[_CREDENTIAL_PARAMS[lowered]] = SecretStr(value)
        elif _SECRET_NAME_RE.search(name):
            secret_extra[name] = SecretStr(value)
        else:
            extra[name] = value
    if ("access_key" in fields) != ("secret_key" in fields):
        raise ValueError(f"{where}: accessKey and secretKey must be given together")
    fields["extra"] = extra
    fields["secret_extra"] = secret_extra
    try:
        return BucketURI(**fields)
    except Exception as exc:  # pydantic.ValidationError: re-raise as a short ValueError
        errors = getattr(exc, "errors", None)
        if callable(errors):
            reasons = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in errors(include_input=False, include_url=False)
            )
        else:
            reasons = str(exc)
        raise ValueError(f"{where}: {reasons}") from None
