"""The files a local cluster writes for its processes and its operator: private (0600)
files, the SASL logins of its admin and brokers, and each broker's config
(broker-N/broker.json) derived from the cluster's."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

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
    return BrokerConfig(**overlay(fields, config.broker_settings))


def overlay(base: dict, settings: dict) -> dict:
    """`base` with `settings` laid over it, section by section (nested dicts merge)."""
    out = dict(base)
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = overlay(out[key], value)
        else:
            out[key] = value
    return out
