"""Shared cluster helpers for e2e tests: `automqctl` in a subprocess, a running cluster
(always stopped, even on failure), a module-scoped cluster fixture, topic creation and
leader lookups.

Thread-safety: plain functions; each call starts its own subprocess or client.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic


def automqctl(*args: str, cluster_dir: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    """`python -m cli.main *args` against `cluster_dir`; its output captured as text."""
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )


@contextlib.contextmanager
def running_cluster(cluster_dir: Path, *up_args: str) -> Iterator[dict]:
    """`automqctl cluster up --format json *up_args` in `cluster_dir` (free ports); yields
    the status JSON of `up`; `cluster down` afterwards, whatever happened (even a failed
    `up` can leave processes behind)."""
    up = automqctl("cluster", "up", "--format", "json", *up_args, cluster_dir=cluster_dir)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield json.loads(up.stdout)
    finally:
        automqctl("cluster", "down", cluster_dir=cluster_dir)
        # the preallocated WAL files (512 MiB a broker) go; logs and the rest stay for
        # a failure's post-mortem (module clusters live until the run ends)
        for wal in cluster_dir.glob("broker-*/storage/wal"):
            wal.unlink(missing_ok=True)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    timeout_s: float = 30,
    configs: dict | None = None,
    exist_ok: bool = False,
) -> None:
    """Create a topic (replication 1) and wait until every partition has a leader.
    `exist_ok`: for a retry after an attempt that failed but may have created the topic
    (Kafka's CreateTopics can answer REQUEST_TIMED_OUT for a topic it then creates)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, partitions, 1, config=configs or {})
    try:
        admin.create_topics([new], operation_timeout=30)[name].result(30)
    except KafkaException as exc:
        if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            t
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 for p in t.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not ready")


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader broker id, from a fresh Metadata request."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in md.topics[topic].partitions.values()}


def cluster_status(cluster_dir: Path) -> dict:
    """`cluster status --format json` as a dict."""
    out = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir)
    return json.loads(out.stdout)


def cluster_fixture(name: str, *up_args: str) -> Callable:
    """A module-scoped pytest fixture: a cluster started with `cluster up *up_args` in a
    fresh directory, yielding {"dir", "bootstrap", "up"} (the status JSON of `up`); stopped
    at the module's end whatever happened. Assign it in a test module:
    `cluster = cluster_fixture("walloss", "--session-timeout-ms", "6000")`."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
        d = tmp_path_factory.mktemp(name) / "cluster"
        with running_cluster(d, *up_args) as up:
            yield {"dir": d, "bootstrap": up["bootstrap_servers"], "up": up}

    return cluster
