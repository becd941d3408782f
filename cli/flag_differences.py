"""What `cluster up` on an existing cluster refuses: the flags given that differ from
what the cluster was created with (they only shape a new cluster)."""

from __future__ import annotations

import os
from pathlib import Path

from cli.cluster_config import MIB, ClusterConfig, effective_wal_capacity_bytes
from cli.external_buckets import external_buckets, load_secrets_file, redact_uri
from controlplane.listeners import ListenerSpecError, parse_listener_kinds


def flag_differences(
    config: ClusterConfig,
    *,
    brokers: int | None = None,
    controllers: int | None = None,
    azs: list[str] | None = None,
    base_port: int | None = None,
    port_range: str | None = None,
    bucket_uris: str | None = None,
    bucket_prefix: str | None = None,
    session_timeout_ms: int | None = None,
    wal_capacity_mib: int | None = None,
    upload_interval_s: float | None = None,
    sasl: bool | None = None,
    tls: bool | None = None,
    retention_check_interval_s: float | None = None,
    wal: str | None = None,
    object_delete_delay_s: float | None = None,
    listeners: str | None = None,
    mtls: bool | None = None,
    bucket_secrets_file: Path | None = None,
    failover_detect_s: float | None = None,
    store_dir: Path | None = None,
    broker_config: list[str] | None = None,
    client_az_cidrs: dict[str, str] | None = None,
    zone_router_channel_mode: str | None = None,
) -> list[str]:
    """The given `cluster up` flags (None: not given) that differ from what `config` was
    created with, each as `--flag VALUE (the cluster has ...)`."""
    return [
        *_topology_differences(
            config, brokers=brokers, controllers=controllers, azs=azs, base_port=base_port
        ),
        *_port_range_differences(config, port_range),
        *_bucket_differences(config, bucket_uris, bucket_prefix),
        *_broker_storage_differences(
            config,
            session_timeout_ms=session_timeout_ms,
            wal_capacity_mib=wal_capacity_mib,
            upload_interval_s=upload_interval_s,
        ),
        *_security_differences(config, sasl=sasl, tls=tls),
        *_interval_differences(
            config,
            retention_check_interval_s=retention_check_interval_s,
            object_delete_delay_s=object_delete_delay_s,
            failover_detect_s=failover_detect_s,
        ),
        *_store_differences(config, bucket_secrets_file=bucket_secrets_file, store_dir=store_dir),
        *_wal_and_listener_differences(config, wal=wal, mtls=mtls, listeners=listeners),
        *_broker_config_differences(config, broker_config),
        *_client_az_differences(config, client_az_cidrs),
        *_channel_mode_differences(config, zone_router_channel_mode),
    ]


def _channel_mode_differences(config: ClusterConfig, mode: str | None) -> list[str]:
    """--zone-router-channel-mode (kept in the brokers' zone_router overrides)."""
    have = (config.broker_overrides.get("zone_router") or {}).get("channel_mode", "all")
    if mode is None or mode == have:
        return []
    return [f"--zone-router-channel-mode {mode} (the cluster has {have})"]


def _client_az_differences(config: ClusterConfig, cidrs: dict[str, str] | None) -> list[str]:
    """--client-az-cidrs (given as {cidr: az})."""
    if cidrs is None or cidrs == config.client_az_cidrs:
        return []
    given = ",".join(f"{az}={cidr}" for cidr, az in cidrs.items()) or "''"
    have = ",".join(f"{az}={cidr}" for cidr, az in config.client_az_cidrs.items()) or "none"
    return [f"--client-az-cidrs {given} (the cluster has {have})"]


def _broker_config_differences(config: ClusterConfig, items: list[str] | None) -> list[str]:
    """--broker-config."""
    from cli.config_files import parse_broker_overrides

    if items is None or parse_broker_overrides(items) == config.broker_overrides:
        return []
    have = config.broker_overrides or "none"
    return [f"--broker-config {' '.join(items)} (the cluster has {have})"]


def _topology_differences(
    config: ClusterConfig,
    *,
    brokers: int | None,
    controllers: int | None,
    azs: list[str] | None,
    base_port: int | None,
) -> list[str]:
    """--brokers, --controllers, --azs, --base-port."""
    out: list[str] = []
    if brokers is not None and brokers != len(config.brokers):
        out.append(f"--brokers {brokers} (the cluster has {len(config.brokers)})")
    if controllers is not None and controllers != len(config.controllers):
        out.append(f"--controllers {controllers} (the cluster has {len(config.controllers)})")
    if azs is not None:
        have = [b.az for b in config.brokers]
        want = [azs[i % len(azs)] for i in range(len(config.brokers))] if azs else []
        if want != have:
            out.append(f"--azs {','.join(azs)} (the brokers are in {','.join(have)})")
    if base_port is not None:
        first = config.base_port
        if first is None and config.controllers:
            first = min(c.raft_port for c in config.controllers)
        if base_port != first:
            out.append(
                f"--base-port {base_port} (the cluster's ports start at {first})"
                if config.base_port is not None
                else f"--base-port {base_port} (the cluster was created with free ports, "
                f"the first {first})"
            )
    return out


def _port_range_differences(config: ClusterConfig, port_range: str | None) -> list[str]:
    """--port-range."""
    from cli.port_allocator import parse_port_range

    if port_range is None or list(parse_port_range(port_range)) == config.port_range:
        return []
    have = "-".join(map(str, config.port_range)) if config.port_range else "none"
    return [f"--port-range {port_range} (the cluster has {have})"]


def _bucket_differences(
    config: ClusterConfig, bucket_uris: str | None, bucket_prefix: str | None
) -> list[str]:
    """--bucket-uris, --bucket-prefix."""
    from cli.cluster_layout import prefixed_buckets
    from dataplane.objectstore.bucket_uri import BucketURI, normalize_key_prefix

    out: list[str] = []
    have_prefix = BucketURI.parse(config.buckets[0].uri).key_prefix if config.buckets else ""
    if bucket_prefix is not None and normalize_key_prefix(bucket_prefix) != have_prefix:
        out.append(f"--bucket-prefix {bucket_prefix} (the cluster has {have_prefix or 'none'})")
    if bucket_uris is not None:
        if config.embedded_s3:
            out.append("--bucket-uris (the cluster uses the embedded object store)")
        else:
            given_buckets = external_buckets(bucket_uris)
            if have_prefix:
                given_buckets = prefixed_buckets(given_buckets, have_prefix)
            given = sorted((b.bucket_id, b.uri) for b in given_buckets)
            have_b = sorted((b.bucket_id, b.uri) for b in config.buckets)
            if given != have_b:
                out.append(
                    f"--bucket-uris (the cluster uses {', '.join(redact_uri(u) for _, u in have_b)})"
                )
    return out


def _broker_storage_differences(
    config: ClusterConfig,
    *,
    session_timeout_ms: int | None,
    wal_capacity_mib: int | None,
    upload_interval_s: float | None,
) -> list[str]:
    """--session-timeout-ms, --wal-capacity-mib, --upload-interval-s."""
    from dataplane.config import UPLOAD_INTERVAL_S

    out: list[str] = []
    if (
        session_timeout_ms is not None
        and session_timeout_ms != config.settings.broker_session_timeout_ms
    ):
        out.append(
            f"--session-timeout-ms {session_timeout_ms} "
            f"(the cluster has {config.settings.broker_session_timeout_ms})"
        )
    if wal_capacity_mib is not None:
        have_mib = effective_wal_capacity_bytes(config) / MIB
        if wal_capacity_mib != have_mib:
            out.append(f"--wal-capacity-mib {wal_capacity_mib} (the cluster has {have_mib:g})")
    if upload_interval_s is not None:
        have_s = config.broker_upload_interval_s or UPLOAD_INTERVAL_S
        if upload_interval_s != have_s:
            out.append(f"--upload-interval-s {upload_interval_s:g} (the cluster has {have_s:g})")
    return out


def _security_differences(
    config: ClusterConfig, *, sasl: bool | None, tls: bool | None
) -> list[str]:
    """--sasl, --tls."""
    out: list[str] = []
    if sasl is not None and sasl != config.sasl:
        out.append(
            f"--{'' if sasl else 'no-'}sasl (the cluster has SASL {'on' if config.sasl else 'off'})"
        )
    if tls is not None and tls != config.tls:
        out.append(
            f"--{'' if tls else 'no-'}tls (the cluster has TLS {'on' if config.tls else 'off'})"
        )
    return out


def _interval_differences(
    config: ClusterConfig,
    *,
    retention_check_interval_s: float | None,
    object_delete_delay_s: float | None,
    failover_detect_s: float | None,
) -> list[str]:
    """--retention-check-interval-s, --object-delete-delay-s, --failover-detect-s."""
    from dataplane.config import RETENTION_CHECK_INTERVAL_MS

    out: list[str] = []
    if retention_check_interval_s is not None:
        have_s = config.broker_retention_check_interval_s or RETENTION_CHECK_INTERVAL_MS / 1000
        if retention_check_interval_s != have_s:
            out.append(
                f"--retention-check-interval-s {retention_check_interval_s:g} "
                f"(the cluster has {have_s:g})"
            )
    if object_delete_delay_s is not None:
        have_ms = config.settings.object_destroy_retention_ms
        if round(object_delete_delay_s * 1000) != have_ms:
            out.append(
                f"--object-delete-delay-s {object_delete_delay_s:g} "
                f"(the cluster has {have_ms / 1000:g})"
            )
    if failover_detect_s is not None:
        have_ms = config.settings.bucket_failover_detect_ms
        if round(failover_detect_s * 1000) != have_ms:
            out.append(
                f"--failover-detect-s {failover_detect_s:g} (the cluster has {have_ms / 1000:g})"
            )
    return out


def _store_differences(
    config: ClusterConfig, *, bucket_secrets_file: Path | None, store_dir: Path | None
) -> list[str]:
    """--bucket-secrets-file, --store-dir."""
    out: list[str] = []
    if bucket_secrets_file is not None:
        if config.embedded_s3:
            out.append("--bucket-secrets-file (the cluster uses the embedded object store)")
        else:
            given_keys = load_secrets_file(bucket_secrets_file)
            if any(
                b.bucket_id in given_keys
                and given_keys[b.bucket_id] != (b.access_key, b.secret_key)
                for b in config.buckets
            ):
                out.append(
                    "--bucket-secrets-file (it holds other credentials than the cluster "
                    "was created with)"
                )
    if store_dir is not None:
        have_dir = config.store_dir or (
            str(Path(config.embedded_s3["data_dir"]).parent) if config.embedded_s3 else None
        )
        if have_dir is None:
            out.append(f"--store-dir {store_dir} (the cluster uses external buckets)")
        elif os.path.realpath(os.path.expanduser(store_dir)) != os.path.realpath(have_dir):
            out.append(f"--store-dir {store_dir} (the cluster's object store is in {have_dir})")
    return out


def _wal_and_listener_differences(
    config: ClusterConfig, *, wal: str | None, mtls: bool | None, listeners: str | None
) -> list[str]:
    """--wal, --mtls, --listeners."""
    out: list[str] = []
    if wal is not None and wal != config.broker_wal:
        out.append(f"--wal {wal} (the cluster has {config.broker_wal})")
    if mtls is not None and mtls != config.mtls:
        out.append(
            f"--{'' if mtls else 'no-'}mtls (the cluster has mutual TLS "
            f"{'on' if config.mtls else 'off'})"
        )
    if listeners is not None:
        have = [(k.name, k.security_protocol) for k in config.listener_kinds()]
        try:
            want = parse_listener_kinds(listeners)
        except ListenerSpecError:
            want = None
        if want != have:
            spec = ",".join(f"{n}:{p}" for n, p in have)
            out.append(f"--listeners {listeners} (the cluster has {spec})")
    return out
