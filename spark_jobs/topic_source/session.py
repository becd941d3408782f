"""A SparkSession with the `automq` source registered and the buckets' keys handed to the
executors the way the compaction job hands them: as executor environment
(AUTOMQ_S3_ACCESS_KEY_<id> / AUTOMQ_S3_SECRET_KEY_<id>, read by BucketURI.credentials),
never in options, task closures or command lines.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.config import QuorumConfig
from spark_jobs.compact import spark_context
from spark_jobs.topic_source.source import register


def bucket_key_env(cluster_dir: str | Path) -> dict[str, str]:
    """The per-bucket key variables of a cluster directory's buckets (its quorum.json)."""
    qpath = Path(cluster_dir) / "quorum.json"
    quorum = QuorumConfig.model_validate_json(qpath.read_text())
    env = {}
    for bucket in quorum.buckets:
        if bucket.access_key:
            env[f"AUTOMQ_S3_ACCESS_KEY_{bucket.bucket_id}"] = bucket.access_key
            env[f"AUTOMQ_S3_SECRET_KEY_{bucket.bucket_id}"] = bucket.secret_key
    return env


def spark_session(master: str, cluster_dir: str | Path | None = None, app_name: str = "automq"):
    """A SparkSession on `master` (local[*], spark://host:7077, ...) with the source
    registered; with `cluster_dir`, its buckets' keys go to the executors' environment
    (else the process's AWS_ACCESS_KEY_ID / AUTOMQ_S3_* variables do, as for compaction)."""
    from pyspark.sql import SparkSession

    env = bucket_key_env(cluster_dir) if cluster_dir is not None else {}
    spark_context(master, app_name, executor_env=env)
    spark = SparkSession.builder.getOrCreate()
    register(spark)
    return spark
