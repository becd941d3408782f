"""The arithmetic of `automqctl cluster top`: Prometheus text parsed, rates and percentiles
from two scrapes of each broker, consumer-group lag from committed and end offsets, and the
one document the view and `--once --format json` show. Pure: no I/O, no clock.

Rates need two scrapes: a counter's rate is its difference over the time between them (a
counter that went backwards, i.e. a restarted broker, counts from zero). A histogram's
percentile is taken over what was observed between the scrapes (the bucket counts'
difference), interpolated inside its bucket as Prometheus' `histogram_quantile` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MB = 1e6  # as `automqctl perf`
MAX_METRICS_LINES = 200_000  # a page longer than this is cut off (a runaway label set)

# the broker metrics the figures come from (the Grafana dashboard's test checks them too)
TOPIC_BYTES_IN = "automq_topic_bytes_in_total"
TOPIC_BYTES_OUT = "automq_topic_bytes_out_total"
REQUEST_LATENCY = "automq_request_latency_seconds"
WAL_USED = "automq_wal_used_bytes"
WAL_CAPACITY = "automq_wal_capacity_bytes"
UPLOAD_LAG = "automq_stream_upload_lag_seconds"
UPLOAD_ERRORS = "automq_stream_upload_errors_total"
UPLOAD_FAILING = "automq_stream_upload_failing"
PARTITIONS_LED = "automq_partitions_led"
CONNECTIONS = "automq_kafka_connections"
# a Fetch waits up to its max_wait_ms for data by design: left out of the request p99
LONG_POLL_APIS = frozenset({"Fetch"})

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
# series name (with its _total / _bucket suffix) -> [(labels, value)]
Scrape = dict[str, list[tuple[Labels, float]]]
Buckets = dict[float, float]  # cumulative count by upper bound (math.inf for +Inf)


def parse_prometheus_text(text: str) -> Scrape:
    """Every sample of a Prometheus text-format page (comments and malformed lines left
    out; at most `MAX_METRICS_LINES` lines read)."""
    scrape: Scrape = {}
    for index, line in enumerate(text.splitlines()):
        if index >= MAX_METRICS_LINES:
            break
        if not line or line.startswith("#"):
            continue
        parsed = _parse_line(line)
        if parsed is not None:
            name, labels, value = parsed
            scrape.setdefault(name, []).append((labels, value))
    return scrape


def _parse_line(line: str) -> tuple[str, Labels, float] | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        labels, end = _parse_labels(line, brace + 1)
        if labels is None:
            return None
        rest = line[end:]
    else:
        if space == -1:
            return None
        name, labels, rest = line[:space], (), line[space:]
    fields = rest.split()
    if not name or not fields:
        return None
    try:
        return name, labels, float(fields[0])  # "+Inf", "NaN" parse too
    except ValueError:
        return None


def _parse_labels(line: str, i: int) -> tuple[Labels | None, int]:
    """The labels from `line[i:]` (just after "{") and the index after the closing "}"."""
    pairs: list[tuple[str, str]] = []
    n = len(line)
    while i < n:
        if line[i] in ", ":
            i += 1
            continue
        if line[i] == "}":
            return tuple(sorted(pairs)), i + 1
        eq = line.find("=", i)
        if eq == -1 or eq + 1 >= n or line[eq + 1] != '"':
            return None, n
        key, i = line[i:eq].strip(), eq + 2
        value: list[str] = []
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                i += 1
                value.append({"n": "\n"}.get(line[i], line[i]))
            else:
                value.append(line[i])
            i += 1
        if i >= n:
            return None, n
        pairs.append((key, "".join(value)))
        i += 1  # the closing quote
    return None, n


def _matches(labels: Labels, match: dict[str, str] | None) -> bool:
    if not match:
        return True
    have = dict(labels)
    return all(have.get(k) == v for k, v in match.items())


def series_sum(scrape: Scrape, name: str, match: dict[str, str] | None = None) -> float | None:
    """The sum of series `name` whose labels include `match` (None: no such series)."""
    values = [v for labels, v in scrape.get(name, []) if _matches(labels, match)]
    return sum(values) if values else None


def by_label(scrape: Scrape, name: str, label: str) -> dict[str, float]:
    """Series `name` summed by the value of `label` (series without it left out)."""
    out: dict[str, float] = {}
    for labels, value in scrape.get(name, []):
        key = dict(labels).get(label)
        if key is not None:
            out[key] = out.get(key, 0.0) + value
    return out


def counter_delta(before: float | None, after: float | None) -> float:
    """What a counter counted between two scrapes; a counter that went backwards (its
    process restarted) counted `after` since; an absent one counted nothing."""
    if after is None:
        return 0.0
    if before is None or after < before:
        return after
    return after - before


def histogram_buckets(
    scrape: Scrape,
    name: str,
    only: dict[str, frozenset[str]] | None = None,
    exclude: dict[str, frozenset[str]] | None = None,
) -> Buckets:
    """The cumulative bucket counts of histogram `name`, summed over its label sets whose
    label values are in `only` (every label it names) and not in `exclude`."""
    buckets: Buckets = {}
    for labels, value in scrape.get(name + "_bucket", []):
        have = dict(labels)
        if only and not all(have.get(k) in vs for k, vs in only.items()):
            continue
        if exclude and any(have.get(k) in vs for k, vs in exclude.items()):
            continue
        bound = have.get("le")
        if bound is None:
            continue
        try:
            upper = float(bound)
        except ValueError:
            continue
        buckets[upper] = buckets.get(upper, 0.0) + value
    return buckets


def bucket_delta(before: Buckets, after: Buckets) -> Buckets:
    """What was observed between two scrapes of one histogram (a counter that went
    backwards, i.e. a restarted broker, gives the later scrape alone)."""
    if any(after.get(bound, 0.0) < count for bound, count in before.items()):
        return dict(after)
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def histogram_quantile(buckets: Buckets, q: float) -> float | None:
    """The `q` quantile (0..1) of cumulative `buckets`, interpolated linearly inside its
    bucket (the first from 0); in the +Inf bucket, the largest finite bound. None without
    observations."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


# a broker's figures in the document (None: unknown)
BROKER_FIGURES = (
    "produce_mb_s",
    "fetch_mb_s",
    "request_p99_ms",
    "produce_p99_ms",
    "wal_used_bytes",
    "wal_capacity_bytes",
    "wal_fill",
    "upload_lag_s",
    "upload_errors",
    "upload_failing",
    "partitions_led",
    "connections",
)


@dataclass(frozen=True)
class BrokerScrape:
    """One broker's /metrics page as read at `at_s` (a monotonic clock); `error` says why
    there is none."""

    node_id: int
    at_s: float
    scrape: Scrape | None
    error: str | None = None


def broker_figures(before: BrokerScrape, after: BrokerScrape) -> dict:
    """One broker's figures between two scrapes: produce / fetch MB/s, request p99 (every
    api but the long-polling Fetch) and produce p99, WAL fill, upload lag and errors,
    partitions led, connections. Every figure is None when a scrape is missing."""
    figures: dict = dict.fromkeys(BROKER_FIGURES)
    figures["error"] = after.error or before.error
    a, b = after.scrape, before.scrape
    if a is None:
        return figures

    def gauge(name: str) -> float | None:
        return series_sum(a, name)

    used, capacity = gauge(WAL_USED), gauge(WAL_CAPACITY)
    failing = gauge(UPLOAD_FAILING)
    figures.update(
        wal_used_bytes=used,
        wal_capacity_bytes=capacity,
        wal_fill=used / capacity if used is not None and capacity else None,
        upload_lag_s=gauge(UPLOAD_LAG),
        upload_failing=None if failing is None else bool(failing),
        partitions_led=_int_or_none(gauge(PARTITIONS_LED)),
        connections=_int_or_none(gauge(CONNECTIONS)),
    )
    dt = after.at_s - before.at_s
    if b is None or dt <= 0:
        return figures
    produced = counter_delta(series_sum(b, TOPIC_BYTES_IN), series_sum(a, TOPIC_BYTES_IN))
    fetched = counter_delta(series_sum(b, TOPIC_BYTES_OUT), series_sum(a, TOPIC_BYTES_OUT))
    not_fetch = {"api": LONG_POLL_APIS}
    requests = bucket_delta(
        histogram_buckets(b, REQUEST_LATENCY, exclude=not_fetch),
        histogram_buckets(a, REQUEST_LATENCY, exclude=not_fetch),
    )
    produce = {"api": frozenset({"Produce"})}
    produces = bucket_delta(
        histogram_buckets(b, REQUEST_LATENCY, only=produce),
        histogram_buckets(a, REQUEST_LATENCY, only=produce),
    )
    figures.update(
        produce_mb_s=round(produced / dt / MB, 4),
        fetch_mb_s=round(fetched / dt / MB, 4),
        request_p99_ms=_ms(histogram_quantile(requests, 0.99)),
        produce_p99_ms=_ms(histogram_quantile(produces, 0.99)),
        upload_errors=int(
            counter_delta(series_sum(b, UPLOAD_ERRORS), series_sum(a, UPLOAD_ERRORS))
        ),
    )
    return figures


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _int_or_none(value: float | None) -> int | None:
    return None if value is None or math.isnan(value) else int(value)


def topic_rates(pairs: list[tuple[BrokerScrape, BrokerScrape]]) -> dict[str, dict[str, float]]:
    """Per topic MB/s in and out, summed over the brokers (each leads some partitions)."""
    out: dict[str, dict[str, float]] = {}
    for before, after in pairs:
        dt = after.at_s - before.at_s
        if before.scrape is None or after.scrape is None or dt <= 0:
            continue
        for key, name in (("in_mb_s", TOPIC_BYTES_IN), ("out_mb_s", TOPIC_BYTES_OUT)):
            old = by_label(before.scrape, name, "topic")
            for topic, total in by_label(after.scrape, name, "topic").items():
                rates = out.setdefault(topic, {"in_mb_s": 0.0, "out_mb_s": 0.0})
                rates[key] += counter_delta(old.get(topic), total) / dt / MB
    return out


def group_lags(
    committed: dict[str, dict[tuple[str, int], int]], end_offsets: dict[tuple[str, int], int]
) -> dict[str, dict[str, int]]:
    """topic -> group -> lag (records): each partition's end offset minus the group's
    committed offset, summed over the partitions the group committed (a partition without
    a known end offset left out, a negative difference counted as 0)."""
    out: dict[str, dict[str, int]] = {}
    for group, offsets in committed.items():
        for (topic, partition), offset in offsets.items():
            end = end_offsets.get((topic, partition))
            if end is None or offset < 0:
                continue
            lags = out.setdefault(topic, {})
            lags[group] = lags.get(group, 0) + max(0, end - offset)
    return out


def top_document(
    status: dict,
    pairs: dict[int, tuple[BrokerScrape, BrokerScrape]],
    lags: dict[str, dict[str, int]] | None,
    lag_error: str | None,
    interval_s: float,
) -> dict:
    """The view's one document (`cluster top --once --format json`): the cluster's state,
    failover mode and active bucket from `status` (`cli.status.collect_status`), each
    broker's figures from its two scrapes in `pairs`, and each topic with traffic or
    consumer groups: its rates and its groups' lag (`lags`: topic -> group -> records;
    None when they could not be read, why in `lag_error`)."""
    active = next((b for b in status.get("buckets", []) if b.get("active")), None)
    brokers = []
    for b in status.get("brokers", []):
        pair = pairs.get(b["node_id"])
        if pair is not None:
            figures = broker_figures(*pair)
        else:
            figures = dict.fromkeys(BROKER_FIGURES)
            figures["error"] = "not scraped" if b.get("metrics_address") else "no metrics port"
        if figures.get("partitions_led") is None:
            figures["partitions_led"] = b.get("partitions_led")
        brokers.append(
            {
                "node_id": b["node_id"],
                "az": b.get("az"),
                "state": _broker_state(b),
                "metrics_address": b.get("metrics_address"),
                **figures,
            }
        )
    rates = topic_rates(list(pairs.values()))
    topics = []
    for name in set(rates) | set(lags or {}):
        in_mb_s = round(rates.get(name, {}).get("in_mb_s", 0.0), 4)
        out_mb_s = round(rates.get(name, {}).get("out_mb_s", 0.0), 4)
        group_lag = (lags or {}).get(name, {})
        if in_mb_s or out_mb_s or group_lag:  # the busy topics and the consumed ones
            topics.append(
                {
                    "topic": name,
                    "in_mb_s": in_mb_s,
                    "out_mb_s": out_mb_s,
                    "group_lag": dict(sorted(group_lag.items(), key=lambda kv: (-kv[1], kv[0]))),
                }
            )
    topics.sort(key=lambda t: (-(t["in_mb_s"] + t["out_mb_s"]), t["topic"]))
    return {
        "cluster_dir": status.get("cluster_dir"),
        "state": status.get("state"),
        "failover_mode": status.get("failover_mode"),
        "active_bucket": None
        if active is None
        else {"bucket_id": active["bucket_id"], "uri": active["uri"]},
        "interval_s": interval_s,
        "produce_mb_s": round(sum(b.get("produce_mb_s") or 0.0 for b in brokers), 4),
        "fetch_mb_s": round(sum(b.get("fetch_mb_s") or 0.0 for b in brokers), 4),
        "brokers": brokers,
        "topics": topics,
        "group_lag_error": lag_error,
        "problems": status.get("problems", []),
    }


def _broker_state(b: dict) -> str:
    if not b.get("registered"):
        return "stopped" if b.get("pid") is None else "unregistered"
    return "fenced" if b.get("fenced") else "active"
