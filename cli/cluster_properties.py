"""`cluster up --config server.properties [--override key=value]`: AutoMQ's and Kafka's
keys (dataplane/config_mapping.py) applied to a local cluster.

The file says what `cluster up`'s flags say (the buckets, the WAL, its capacity) and more:
settings every broker gets (caches, bandwidth, limits: `ClusterConfig.broker_settings`),
the controller's (`offsets.topic.num.partitions`) and the topic defaults, which are set as
cluster-wide dynamic broker configs once the new cluster's controllers are up. A flag and a
key that say different things are refused by name; so is a file that differs from what the
existing cluster was created with. Buckets named by the file are external ones (as with
`--bucket-uris`); without bucket keys, the cluster runs its embedded stores.
"""

from __future__ import annotations

import os
from pathlib import Path

from cli.cluster_config import MIB, ClusterConfig, ClusterError
from dataplane.config_mapping import (
    SECRET_KEYS,
    PropertiesMapping,
    map_properties,
    with_known_buckets,
)
from dataplane.config_properties import (
    PropertiesError,
    file_is_private,
    parse_overrides,
    read_properties_file,
)
from dataplane.objectstore import parse_bucket_uris


def load_mapping(
    config_file: Path | None, overrides: list[str], bucket_uris: str | None = None
) -> PropertiesMapping | None:
    """The file's keys, with the overrides, mapped for a local cluster (None: neither was
    given); PropertiesError names the bad key. `bucket_uris`: `--bucket-uris`, whose buckets
    KAFKA_S3_ACCESS_KEY / _SECRET_KEY apply to when the file names none."""
    if config_file is None and not overrides:
        return None
    props = read_properties_file(config_file) if config_file is not None else {}
    if config_file is not None and SECRET_KEYS & props.keys() and not file_is_private(config_file):
        key = sorted(SECRET_KEYS & props.keys())[0]
        raise PropertiesError(
            f"{key}: {config_file} holds bucket credentials but others may read it (chmod 600)"
        )
    props.update(parse_overrides(overrides))
    props = with_known_buckets(props, os.environ, bucket_uris)
    return map_properties(props, "cluster", env=os.environ)


def apply_to_flags(mapping: PropertiesMapping, values: dict, given: dict) -> None:
    """Put what the file says into `values` (the `up` parameters) and `given` (the flags to
    compare with an existing cluster); PropertiesError when a given flag says otherwise."""
    if mapping.bucket_uris is not None:
        if given.get("bucket_uris") is not None and _bucket_ids_and_names(
            given["bucket_uris"]
        ) != _bucket_ids_and_names(mapping.bucket_uris):
            raise PropertiesError("s3.data.buckets: --bucket-uris names other buckets")
        if given.get("bucket_secrets_file") is not None and mapping.bucket_credentials:
            raise PropertiesError(
                "KAFKA_S3_ACCESS_KEY: --bucket-secrets-file gives the credentials too"
            )
        values["bucket_uris"] = given["bucket_uris"] = mapping.bucket_uris
    if mapping.wal_in_bucket:
        if given.get("wal") == "file":
            raise PropertiesError("s3.wal.path: names a bucket, --wal file a local file")
        values["wal"] = type(values["wal"])("s3")  # cluster_up.WALKind (which imports us)
        given["wal"] = "s3"
    capacity = mapping.settings.get("wal", {}).get("capacity_bytes")
    if capacity is not None:
        mib = given.get("wal_capacity_mib")
        if mib is not None and mib * MIB != capacity:
            raise PropertiesError(
                f"s3.wal.path: its capacity differs from --wal-capacity-mib {mib}"
            )


def _bucket_ids_and_names(uris: str) -> list[tuple[int, str, str | None]]:
    try:
        return [(u.bucket_id, u.bucket, u.endpoint) for u in parse_bucket_uris(uris)]
    except ValueError as exc:
        raise PropertiesError(f"--bucket-uris: {exc}") from None


def broker_settings_of(mapping: PropertiesMapping) -> dict:
    """The broker settings a cluster keeps (the WAL's capacity is its own field)."""
    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in mapping.settings.items()}
    wal = settings.get("wal", {})
    wal.pop("capacity_bytes", None)
    if not wal:
        settings.pop("wal", None)
    return settings


def configure_new(config: ClusterConfig, mapping: PropertiesMapping) -> ClusterConfig:
    """A new cluster's config with what the file says that flags cannot."""
    capacity = mapping.settings.get("wal", {}).get("capacity_bytes")
    buckets = [
        b.model_copy(
            update=dict(zip(("access_key", "secret_key"), mapping.bucket_credentials[b.bucket_id]))
        )
        if b.bucket_id in mapping.bucket_credentials
        else b
        for b in config.buckets
    ]
    update: dict = {
        "broker_settings": broker_settings_of(mapping),
        "topic_defaults": dict(mapping.topic_defaults),
        "buckets": buckets,
        "settings": config.settings.model_copy(update=mapping.controller_settings),
    }
    if capacity is not None:
        update["broker_wal_capacity_bytes"] = capacity
    return config.model_copy(update=update)


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """{dotted path: value} of a nested settings dict."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _changed(given: dict, have: dict, what: str) -> list[str]:
    """`--config: <what> PATH VALUE (the cluster has ...)` for each differing leaf."""
    given_leaves, have_leaves = _leaves(given), _leaves(have)
    return [
        f"--config: {what} {path} {given_leaves.get(path, '(default)')} "
        f"(the cluster has {have_leaves.get(path, 'the default')})"
        for path in sorted(given_leaves.keys() | have_leaves.keys())
        if given_leaves.get(path) != have_leaves.get(path)
    ]


def differences(config: ClusterConfig, mapping: PropertiesMapping) -> list[str]:
    """What the file says that differs from the existing cluster's config."""
    out = _changed(broker_settings_of(mapping), config.broker_settings, "broker setting")
    out += _changed(dict(mapping.topic_defaults), config.topic_defaults, "topic default")
    for key, value in mapping.controller_settings.items():
        if getattr(config.settings, key) != value:
            out.append(f"--config: {key} {value} (the cluster has {getattr(config.settings, key)})")
    capacity = mapping.settings.get("wal", {}).get("capacity_bytes")
    if capacity is not None and capacity != (config.broker_wal_capacity_bytes or capacity):
        out.append(
            f"--config: WAL capacity {capacity} (the cluster has "
            f"{config.broker_wal_capacity_bytes})"
        )
    return out


def set_topic_defaults(config: ClusterConfig) -> None:
    """The file's topic defaults as cluster-wide dynamic broker configs (a new cluster)."""
    if not config.topic_defaults:
        return
    from controlplane.errors import ControllerError
    from controlplane.requests import AlterBrokerConfigsRequest, TopicConfigOp

    client = config.controller_client(timeout_s=30)
    ops = [TopicConfigOp(key=k, op="set", value=v) for k, v in config.topic_defaults.items()]
    try:
        client.alter_broker_configs(AlterBrokerConfigsRequest(resource="", ops=ops))
    except ControllerError as exc:
        raise ClusterError(f"could not set the topic defaults of --config: {exc}") from None
