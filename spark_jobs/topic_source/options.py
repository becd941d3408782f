"""The options of the `automq` Spark source, parsed and checked on the driver (pure).

Option names follow Spark's Kafka source where one exists (`subscribe`, `subscribePattern`,
`assign`, `startingOffsets`, `endingOffsets`, `startingTimestamp`, `failOnDataLoss`,
`maxOffsetsPerTrigger`); the source's own are `cluster`, `topic`, `buckets`,
`isolation.level` (`kafka.isolation.level` is accepted too) and `automq.split.bytes`.
Every check raises `TopicSourceError` with a message that says what to change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST = -2  # Spark's Kafka source: -2 in an offsets JSON means earliest
LATEST = -1  # and -1 latest
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
DEFAULT_SPLIT_BYTES = 32 * 1024 * 1024
MIN_SPLIT_BYTES = 64 * 1024
MAX_SPLIT_BYTES = 4 * 1024 * 1024 * 1024
MAX_TOPICS = 10_000
MAX_OPTION_CHARS = 1024 * 1024


class TopicSourceError(ValueError):
    """Bad input to the `automq` source (options, a missing topic, an unreadable object)."""


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read (batch or stream).

    `starting`/`ending`: "earliest", "latest" or {topic: {partition: offset}} with
    EARLIEST/LATEST allowed as offsets; `ending` is None for a stream.
    """

    cluster: str
    buckets: dict[int, str]
    topics: tuple[str, ...]  # subscribe / topic / assign's topics
    pattern: str | None  # subscribePattern
    assign: dict[str, tuple[int, ...]] | None
    starting: str | dict[str, dict[int, int]]
    ending: str | dict[str, dict[int, int]]
    starting_timestamp_ms: int | None
    read_committed: bool
    fail_on_data_loss: bool
    split_bytes: int
    max_offsets_per_trigger: int | None
    # `kafka.*` options without the prefix: the client that asks brokers for last stable
    # offsets under read_committed (stable.py)
    kafka: dict[str, str]


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for key, value in options.items():
        text = str(value)
        if len(text) > MAX_OPTION_CHARS:
            raise TopicSourceError(f"option {key!r} is longer than {MAX_OPTION_CHARS} characters")
        out[key.lower()] = text
    return out


def _offsets(name: str, text: str) -> str | dict[str, dict[int, int]]:
    """`earliest`, `latest` or a per-partition JSON like {"orders":{"0":23,"1":-2}}."""
    t = text.strip()
    if t.lower() in ("earliest", "latest"):
        return t.lower()
    try:
        raw = json.loads(t)
    except ValueError:
        raise TopicSourceError(
            f'{name} must be "earliest", "latest" or JSON like {{"orders":{{"0":23,"1":-2}}}}; '
            f"got {text[:100]!r}"
        ) from None
    if not isinstance(raw, dict):
        raise TopicSourceError(f"{name}: a JSON object of topic -> {{partition: offset}} expected")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict):
            raise TopicSourceError(f"{name}: topic {topic!r} needs {{partition: offset}}")
        try:
            out[topic] = {int(p): int(o) for p, o in parts.items()}
        except (TypeError, ValueError):
            raise TopicSourceError(
                f"{name}: topic {topic!r}: partitions and offsets are integers"
            ) from None
        bad = [o for o in out[topic].values() if o < EARLIEST]
        if bad:
            raise TopicSourceError(f"{name}: offset {bad[0]} of {topic!r} (use >= 0, -2, -1)")
    return out


def _int_option(opts: dict[str, str], name: str, low: int, high: int) -> int | None:
    if name.lower() not in opts:
        return None
    try:
        value = int(opts[name.lower()])
    except ValueError:
        raise TopicSourceError(f"{name} must be an integer, got {opts[name.lower()]!r}") from None
    if not low <= value <= high:
        raise TopicSourceError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _subscription(opts: dict[str, str]) -> tuple[tuple[str, ...], str | None, dict | None]:
    given = [k for k in ("topic", "subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(given) != 1:
        raise TopicSourceError(
            "give exactly one of the options topic, subscribe, subscribePattern, assign"
            + (f" (got {', '.join(given)})" if given else "")
        )
    kind = given[0]
    if kind == "subscribepattern":
        try:
            re.compile(opts[kind])
        except re.error as exc:
            raise TopicSourceError(f"subscribePattern is not a regular expression: {exc}") from None
        return (), opts[kind], None
    if kind == "assign":
        try:
            raw = json.loads(opts[kind])
            assign = {str(t): tuple(int(p) for p in ps) for t, ps in raw.items()}
        except (ValueError, TypeError, AttributeError):
            raise TopicSourceError('assign must be JSON like {"orders":[0,1]}') from None
        return tuple(sorted(assign)), None, assign
    topics = tuple(t.strip() for t in opts[kind].split(",") if t.strip())
    if not topics or len(topics) > MAX_TOPICS:
        raise TopicSourceError(f"{kind}: 1 to {MAX_TOPICS} topic names, comma-separated")
    return topics, None, None


def _buckets(opts: dict[str, str]) -> dict[int, str]:
    if "buckets" not in opts:
        return {}
    try:
        raw = json.loads(opts["buckets"])
        return {int(k): str(v) for k, v in raw.items()}
    except (ValueError, TypeError, AttributeError):
        raise TopicSourceError(
            'buckets must be JSON like {"0": "0@s3://bucket?region=...&endpoint=..."}'
        ) from None


def _isolation(opts: dict[str, str]) -> bool:
    level = opts.get("isolation.level", opts.get("kafka.isolation.level", READ_COMMITTED))
    if level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise TopicSourceError(f"isolation.level must be {READ_COMMITTED} or {READ_UNCOMMITTED}")
    return level == READ_COMMITTED


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise TopicSourceError(f"{name} must be true or false, got {text!r}")
    return text.lower() == "true"


def parse_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """The checked options of a batch read (`streaming` False) or a stream."""
    opts = _lower(options)
    cluster = opts.get("cluster", "").strip()
    if not cluster:
        raise TopicSourceError(
            'option "cluster" is required: the cluster directory, or its controller API '
            "addresses (host:port,... or http(s)://host:port,...)"
        )
    topics, pattern, assign = _subscription(opts)
    starting = _offsets(
        "startingOffsets", opts.get("startingoffsets", "latest" if streaming else "earliest")
    )
    if streaming and "endingoffsets" in opts:
        raise TopicSourceError("endingOffsets is for batch reads (spark.read), not streams")
    ending = _offsets("endingOffsets", opts.get("endingoffsets", "latest"))
    if ending == "earliest" or (
        isinstance(ending, dict) and any(EARLIEST in p.values() for p in ending.values())
    ):
        raise TopicSourceError("endingOffsets cannot be earliest (-2)")
    if starting == "latest" and not streaming:
        raise TopicSourceError("startingOffsets=latest is for streams; a batch read needs earliest")
    return SourceOptions(
        cluster=cluster,
        buckets=_buckets(opts),
        topics=topics,
        pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=_int_option(opts, "startingTimestamp", 0, 2**62),
        read_committed=_isolation(opts),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        split_bytes=_int_option(opts, "automq.split.bytes", MIN_SPLIT_BYTES, MAX_SPLIT_BYTES)
        or DEFAULT_SPLIT_BYTES,
        max_offsets_per_trigger=_int_option(opts, "maxOffsetsPerTrigger", 1, 2**62),
        kafka={
            k[len("kafka.") :]: v
            for k, v in options.items()
            if k.lower().startswith("kafka.") and k.lower() != "kafka.isolation.level"
        },
    )
