"""The `automq` Spark source: topics read straight from object storage (docs/spark.md).

    from spark_jobs import topic_source
    spark = topic_source.spark_session("local[*]", cluster_dir)   # registered, with keys
    # or, with a SparkSession of your own:
    topic_source.register(spark)   # = spark.dataSource.register(AutomqDataSource)

Modules: `options` (the options, checked), `plan` (driver: metadata -> offsets -> splits),
`read` (executors: objects -> records), `source` (the pyspark classes), `session`.
"""

from __future__ import annotations

from spark_jobs.topic_source.options import TopicSourceError
from spark_jobs.topic_source.session import bucket_key_env, spark_session
from spark_jobs.topic_source.source import AutomqDataSource, register

__all__ = ["AutomqDataSource", "TopicSourceError", "bucket_key_env", "register", "spark_session"]
