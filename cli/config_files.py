"""The files a local cluster writes for its processes and its operator: private (0600)
files, the SASL logins of its admin and brokers, and each broker's config
(broker-N/broker.json) derived from the cluster's."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.cluster_config import (
    ADMIN_USER,
    BROKER_USER,
    BrokerSpec,
    ClusterConfig,
    ClusterError,
    broker_wal_uri,
)

if TYPE_CHECKING:
    from dataplane.config import BrokerConfig


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (mode 0600), creating its parent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def write_new_login(path: Path, username: str, **extra: str) -> dict:
    """A fresh SCRAM-SHA-512 login of `username` (a random password, then `extra`) written
    to `path` as JSON, 0600."""
    creds = {
        "username": username,
        "password": secrets.token_urlsafe(24),
        "mechanism": "SCRAM-SHA-512",
        **extra,
    }
    write_private(path, json.dumps(creds, indent=2) + "\n")
    return creds


def read_login(path: Path) -> dict | None:
    """The login a `write_new_login` file holds (None: there is none), or ClusterError."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{path} is unreadable: {exc}") from None


def parse_broker_overrides(items: list[str]) -> dict[str, Any]:
    """`cluster up --broker-config section.key=value` items as nested dicts of the broker
    config's sections (a value is JSON when it parses, else a string), checked against
    the broker config's models; ClusterError names a bad item."""
    from pydantic import ValidationError

    from dataplane.config import BrokerConfig

    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        path = key.strip().split(".")
        if not sep or len(path) < 2 or not all(path):
            raise ClusterError(
                f"--broker-config {item!r}: give section.key=value, e.g. "
                "network.egress_bytes_per_s=20000000"
            )
        if path[0] not in BrokerConfig.model_fields or path[0] not in _SECTIONS:
            raise ClusterError(
                f"--broker-config {item!r}: {path[0]!r} is no broker config section "
                f"({', '.join(_SECTIONS)})"
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = overrides
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    try:
        for section, values in overrides.items():
            BrokerConfig.model_fields[section].annotation.model_validate(values)
    except ValidationError as exc:
        raise ClusterError(f"--broker-config: {exc}") from None
    return overrides


# the broker config's sections `--broker-config` may set (the rest the cluster derives)
_SECTIONS = (
    "storage",
    "wal",
    "object_store",
    "groups",
    "zone_router",
    "erasure",
    "network",
    "share_groups",
)


def merged_sections(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` merged in, nested dicts key by key (pure)."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged_sections(out[key], value)
        else:
            out[key] = value
    return out


def broker_config(
    config: ClusterConfig, spec: BrokerSpec, data_dir: Path, tls_dir: Path, login: dict | None
) -> BrokerConfig:
    """The config of broker `spec` of the cluster: its data in `data_dir`, the cluster's
    certificates in `tls_dir`, `login` the brokers' inter-broker SASL login (None: none)."""
    from dataplane.config import BrokerConfig  # the broker's own config model

    node_id = spec.node_id
    storage: dict = {"storage": {}, "wal": {}}  # the broker config's sections
    if config.broker_wal_capacity_bytes is not None:
        storage["wal"]["capacity_bytes"] = config.broker_wal_capacity_bytes
    if config.broker_upload_interval_s is not None:
        storage["storage"]["upload_interval_s"] = config.broker_upload_interval_s
    if config.broker_retention_check_interval_s is not None:
        storage["retention_check_interval_ms"] = round(
            config.broker_retention_check_interval_s * 1000
        )
    if config.broker_wal == "s3":
        storage["wal"]["uri"] = broker_wal_uri(config, node_id)
    if config.client_az_cidrs:
        storage["zone_router"] = {"client_az_cidrs": dict(config.client_az_cidrs)}
    if spec.shard_store_port:
        storage["erasure"] = {"shard_store_port": spec.shard_store_port}
    for section in config.broker_overrides:
        # a section given in part keeps the broker's defaults for the rest (the broker's
        # object_store default differs from ObjectStorageConfig's own)
        default = BrokerConfig.model_fields[section].get_default(call_default_factory=True)
        storage[section] = merged_sections(default.model_dump(), storage.get(section, {}))
    storage = merged_sections(storage, config.broker_overrides)
    endpoints = config.broker_endpoints(spec)
    # brokers talk to each other on the CLI's listener (the inter-broker login needs SASL
    # on a --sasl cluster): it goes first, the rest keep their order
    first = config.client_listener_index()
    endpoints = [endpoints[first]] + endpoints[:first] + endpoints[first + 1 :]
    fields = dict(
        node_id=node_id,
        az=spec.az,
        host=config.host,
        kafka_port=endpoints[0].port,
        listeners=endpoints if config.listeners else None,
        data_dir=data_dir,
        controllers=config.quorum_config().api_addresses(),
        bucket_uris=",".join(b.uri_with_credentials() for b in config.buckets),
        metrics_port=spec.metrics_port or 0,
        controller_api_secret=config.api_secret,
        controller_ca_file=config.controller_ca_file,
        sasl_enabled=config.sasl,
        super_users=[f"User:{ADMIN_USER}", f"User:{BROKER_USER}"]
        if config.sasl or config.mtls
        else [],
        ssl_client_auth="required" if config.mtls else "none",
        tls_client_cert_file=tls_dir / "broker.pem" if config.mtls else None,
        tls_client_key_file=tls_dir / "broker.key" if config.mtls else None,
        tls_cert_file=tls_dir / "server.pem" if config.tls else None,
        tls_key_file=tls_dir / "server.key" if config.tls else None,
        tls_ca_file=tls_dir / "ca.pem" if config.tls else None,
        inter_broker_sasl_username=login["username"] if login else None,
        inter_broker_sasl_password=login["password"] if login else None,
        inter_broker_sasl_mechanism=login["mechanism"] if login else "SCRAM-SHA-512",
        **storage,
    )
    return BrokerConfig(**merged_sections(fields, config.broker_settings))
