"""External S3 buckets of a local cluster (`cluster up --bucket-uris`): their configs and
credentials, whether they answer, and their URIs without secrets for display."""

from __future__ import annotations

import os
from pathlib import Path

from cli.cluster_config import ClusterError
from controlplane.config import BucketConfig


def redact_uri(uri: str) -> str:
    """A bucket URI without credentials in its query string."""
    if "?" not in uri:
        return uri
    base, query = uri.split("?", 1)
    kept = [
        p
        for p in query.split("&")
        if p.split("=", 1)[0].lower()
        not in ("accesskey", "secretkey", "access_key", "secret_key", "sessiontoken")
    ]
    return base + ("?" + "&".join(kept) if kept else "")


def _uri_query(uri: str) -> dict[str, str]:
    """The `key=value` parameters of a bucket URI's query string."""
    if "?" not in uri:
        return {}
    return dict(q.split("=", 1) for q in uri.split("?", 1)[1].split("&") if "=" in q)


def load_secrets_file(path: Path) -> dict[int, tuple[str, str]]:
    """Bucket id -> (access key, secret key) from `--bucket-secrets-file`, or ClusterError."""
    from dataplane.objectstore.secrets_file import BucketSecretsError, load_bucket_secrets

    try:
        return load_bucket_secrets(path)
    except BucketSecretsError as exc:
        raise ClusterError(str(exc)) from None


def external_buckets(bucket_uris: str, secrets_file: Path | None = None) -> list[BucketConfig]:
    """Bucket configs from `0@s3://b?region=..&endpoint=..,1@s3://...`. Each bucket's
    credentials, first found wins: the URI (accessKey/secretKey), the secrets file
    (AUTOMQ_S3_ACCESS_KEY_<id>/AUTOMQ_S3_SECRET_KEY_<id>, mode 0600), the environment's
    AUTOMQ_S3_ACCESS_KEY_<id>/AUTOMQ_S3_SECRET_KEY_<id>, AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY."""
    from_file = load_secrets_file(secrets_file) if secrets_file is not None else {}
    buckets: list[BucketConfig] = []
    for part in [p.strip() for p in bucket_uris.split(",") if p.strip()]:
        if "@" not in part:
            raise ClusterError(f"bucket URI {part!r} needs an id: ID@s3://bucket?...")
        id_text, uri = part.split("@", 1)
        if not id_text.isdigit() or not uri.startswith("s3://"):
            raise ClusterError(f"bucket URI {part!r} must look like 0@s3://bucket?region=..")
        query = _uri_query(uri)
        bucket_id = int(id_text)
        env_own = (
            os.environ.get(f"AUTOMQ_S3_ACCESS_KEY_{bucket_id}", ""),
            os.environ.get(f"AUTOMQ_S3_SECRET_KEY_{bucket_id}", ""),
        )
        env_aws = (
            os.environ.get("AWS_ACCESS_KEY_ID", ""),
            os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        )
        if "accessKey" in query:
            keys = (query["accessKey"], query.get("secretKey", ""))
        elif bucket_id in from_file:
            keys = from_file[bucket_id]
        elif all(env_own):
            keys = env_own
        else:
            keys = env_aws
        buckets.append(
            BucketConfig(
                bucket_id=bucket_id,
                uri=f"{id_text}@{redact_uri(uri)}",
                access_key=keys[0],
                secret_key=keys[1],
            )
        )
    unknown = sorted(set(from_file) - {b.bucket_id for b in buckets})
    if unknown:
        raise ClusterError(
            f"{secrets_file} holds credentials of bucket(s) {unknown} that --bucket-uris "
            "does not name"
        )
    ids = [b.bucket_id for b in buckets]
    if not buckets or len(set(ids)) != len(ids):
        raise ClusterError("bucket URIs need distinct ids, e.g. 0@s3://main?..,1@s3://failover?..")
    return buckets


def check_bucket_reachable(bucket: BucketConfig, timeout_s: float = 5.0) -> None:
    """head_bucket with short timeouts: a clear error instead of a hang or a traceback."""
    import boto3
    from botocore.config import Config

    uri = bucket.uri.split("@", 1)[1]
    name = uri[len("s3://") :].split("?", 1)[0]
    query = _uri_query(uri)
    client = boto3.client(
        "s3",
        endpoint_url=query.get("endpoint"),
        region_name=query.get("region", "us-east-1"),
        aws_access_key_id=bucket.access_key or None,
        aws_secret_access_key=bucket.secret_key or None,
        config=Config(
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )
    try:
        client.head_bucket(Bucket=name)
    except Exception as exc:
        raise ClusterError(
            f"bucket {bucket.bucket_id} ({redact_uri(uri)}) is not reachable: {exc}"
        ) from None
