"""Table topics (issue #29): a topic's committed records kept as an Iceberg table.

`spec` says what a topic's table is (from its topic configs; pure), `rows` turns Kafka
records (Arrow batches of Spark's Kafka-source schema) into the table's rows and Parquet
files, `catalog` opens the Iceberg catalog (PyIceberg) and commits a run's files with the
offsets they hold. The Spark job is `spark_jobs/table_sync.py`; the CLI `cli/table.py`.
"""
