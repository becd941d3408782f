"""What `automqctl cluster top` reads: each broker's Prometheus /metrics page, the cluster's
status (failover mode, active bucket: `cli.status`), and the consumer groups' lag from the
Kafka admin API. Every read is bounded in time; the arithmetic is in `cli.top_metrics`.

Thread-safety: a `TopSampler` is used by one thread at a time (the view's sampling thread,
or the caller's for `--once`).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from cli.cluster_config import ClusterConfig
from cli.kafka_util import QUIET_RDKAFKA, client_error_text, librdkafka_security
from cli.local_cluster import LocalCluster
from cli.status import collect_status
from cli.top_metrics import BrokerScrape, group_lags, parse_prometheus_text, top_document

SCRAPE_TIMEOUT_S = 2.0
MAX_METRICS_BYTES = 16 * 1024 * 1024  # a larger /metrics page is cut off
LAG_TIMEOUT_S = 3.0  # the consumer groups' lag, all requests together
MAX_GROUPS = 100  # groups whose lag is read (the first by name)
MAX_SCRAPERS = 16  # brokers scraped at once


def scrape_broker(node_id: int, address: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> BrokerScrape:
    """One broker's /metrics at `address` (host:port), or why not."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as response:
            body = response.read(MAX_METRICS_BYTES)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return BrokerScrape(node_id, time.monotonic(), None, f"metrics {address}: {reason}")
    at_s = time.monotonic()
    return BrokerScrape(node_id, at_s, parse_prometheus_text(body.decode(errors="replace")))


class GroupLagReader:
    """Every consumer group's lag per topic through one admin client (confluent-kafka):
    ListGroups, OffsetFetch per group, ListOffsets (latest) of the partitions they
    committed; all of it within `timeout_s`."""

    def __init__(self, bootstrap: str, security: dict, timeout_s: float = LAG_TIMEOUT_S):
        from confluent_kafka.admin import AdminClient

        self.timeout_s = timeout_s
        self._admin = AdminClient(
            {
                "bootstrap.servers": bootstrap,
                "client.id": "automqctl-top",
                "socket.timeout.ms": int(timeout_s * 1000),
                **QUIET_RDKAFKA,
                **security,
            }
        )

    def read(self) -> tuple[dict[str, dict[str, int]] | None, str | None]:
        """(topic -> group -> lag in records, None) or (None, why it could not be read)."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        deadline = time.monotonic() + self.timeout_s

        def left_s() -> float:
            return max(0.1, deadline - time.monotonic())

        try:
            listed = self._admin.list_consumer_groups(request_timeout=left_s()).result(left_s())
            groups = sorted(g.group_id for g in listed.valid)[:MAX_GROUPS]
            futures = {
                group: self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(group)], request_timeout=left_s()
                )[group]
                for group in groups
            }
            committed: dict[str, dict[tuple[str, int], int]] = {}
            for group, future in futures.items():
                answer = future.result(left_s())
                committed[group] = {
                    (tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions or []
                }
            # groups keep offsets of deleted topics: only partitions that exist are asked
            existing = {
                (name, p)
                for name, topic in self._admin.list_topics(timeout=left_s()).topics.items()
                for p in topic.partitions
            }
            partitions = {key for offsets in committed.values() for key in offsets} & existing
            ends: dict[tuple[str, int], int] = {}
            if partitions:
                answers = self._admin.list_offsets(
                    {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions},
                    request_timeout=left_s(),
                )
                for tp, future in answers.items():
                    try:
                        ends[(tp.topic, tp.partition)] = future.result(left_s()).offset
                    except KafkaException:  # this partition's (e.g. its leader moving)
                        continue
        except FutureTimeout:
            return None, f"consumer group lag: no answer within {self.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - any client error is shown, not raised
            return None, f"consumer group lag: {client_error_text(exc)}"
        return group_lags(committed, ends), None


class TopSampler:
    """Two scrapes of every broker apart in time, the status and the lag: `sample()` returns
    the view's document over the time since the previous call's scrapes."""

    def __init__(self, cluster: LocalCluster, config: ClusterConfig, interval_s: float):
        self.cluster = cluster
        self.config = config
        self.interval_s = interval_s
        self._lag = GroupLagReader(
            config.bootstrap_servers(), librdkafka_security(cluster.client_security())
        )
        self._pool = ThreadPoolExecutor(MAX_SCRAPERS, thread_name_prefix="top-scrape")
        self._previous: dict[int, BrokerScrape] = {}

    def close(self) -> None:
        """Stop the scraping threads (a scrape under way finishes on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _scrape_all(self) -> dict[int, BrokerScrape]:
        targets = [
            (spec.node_id, f"{self.config.host}:{spec.metrics_port}")
            for spec in self.config.brokers
            if spec.metrics_port
        ]
        futures = [self._pool.submit(scrape_broker, n, a) for n, a in targets]
        return {s.node_id: s for s in (f.result() for f in futures)}

    def prime(self) -> None:
        """The first scrapes (rates start from them)."""
        self._previous = self._scrape_all()

    def sample(self) -> dict:
        """The document over the time since the previous scrapes (`prime` first)."""
        status_future = self._pool.submit(collect_status, self.cluster, self.config)
        lag_future = self._pool.submit(self._lag.read)
        scrapes = self._scrape_all()
        pairs = {
            node: (self._previous.get(node, BrokerScrape(node, now.at_s, None)), now)
            for node, now in scrapes.items()
        }
        self._previous = scrapes
        lags, lag_error = lag_future.result()
        return top_document(status_future.result(), pairs, lags, lag_error, self.interval_s)

    def once(self) -> dict:
        """One document: two scrapes `interval_s` apart."""
        self.prime()
        time.sleep(self.interval_s)
        return self.sample()
