"""The broker's config tree (dataplane/config.py): sections, old flat files, the generated
reference (docs/configuration.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from dataplane.config import (
    BROKER_OBJECT_STORE_CONCURRENCY,
    BrokerConfig,
    StorageConfig,
    WALConfig,
)
from dataplane.config_reference import DOC_PATH, main, reference_markdown
from dataplane.erasure.store_server import INJECT_DELAY_ENV, bench_inject_delay_ms

BASE = dict(node_id=1, az="az1", kafka_port=9092, data_dir="/tmp/b1", controllers=["c:1"])

# what `automqctl cluster up` of the previous version wrote (BrokerConfig.model_dump_json of
# the flat model): such cluster directories must still start
FLAT_CONFIG = {
    "node_id": 1,
    "az": "az1",
    "host": "127.0.0.1",
    "kafka_port": 9092,
    "data_dir": "/tmp/cluster/broker-1",
    "controllers": ["127.0.0.1:9094"],
    "heartbeat_interval_ms": 1000,
    "bucket_uris": "0@s3://automq-main?endpoint=http://127.0.0.1:8333",
    "wal_capacity_bytes": 64 * 1024 * 1024,
    "wal_uri": "s3://automq-main/wal/node-1",
    "upload_threshold_bytes": 67108864,
    "upload_interval_s": 2.0,
    "block_cache_bytes": 536870912,
    "max_request_bytes": 104857600,
    "retention_check_interval_ms": 1000,
    "metrics_port": 0,
    "shard_store_port": 19001,
    "shard_store_inject_delay_ms": 0,
    "bucket_probe_interval_ms": 2000,
    "controller_api_secret": "s3cret",
    "controller_ca_file": None,
    "sasl_enabled": False,
    "super_users": [],
    "allow_insecure": False,
    "tls_cert_file": None,
    "tls_key_file": None,
    "inter_broker_sasl_username": None,
    "inter_broker_sasl_password": None,
    "inter_broker_sasl_mechanism": "SCRAM-SHA-512",
    "tls_ca_file": None,
    "ssl_client_auth": "none",
    "tls_client_cert_file": None,
    "tls_client_key_file": None,
    "listeners": None,
    "advertised_listeners": None,
    "client_az_cidrs": {"10.0.1.0/24": "az1"},
}


def test_a_flat_config_of_the_previous_version_loads_into_the_sections():
    cfg = BrokerConfig.model_validate_json(json.dumps(FLAT_CONFIG))
    assert cfg.wal.capacity_bytes == 64 * 1024 * 1024
    assert cfg.wal.uri == "s3://automq-main/wal/node-1"
    assert cfg.storage.upload_threshold_bytes == 67108864
    assert cfg.storage.upload_interval_s == 2.0
    assert cfg.storage.block_cache_bytes == 536870912
    assert cfg.erasure.shard_store_port == 19001
    assert cfg.zone_router.client_az_cidrs == {"10.0.1.0/24": "az1"}
    assert cfg.retention_check_interval_ms == 1000 and cfg.controller_api_secret == "s3cret"
    # written back, it is the new shape, and reads back the same
    dumped = json.loads(cfg.model_dump_json())
    assert "wal_capacity_bytes" not in dumped and "shard_store_inject_delay_ms" not in dumped
    assert BrokerConfig.model_validate(dumped) == cfg


def test_a_key_given_flat_and_in_its_section_must_agree():
    same = BrokerConfig(**BASE, wal_uri="file:///w", wal={"uri": "file:///w"})
    assert same.wal.uri == "file:///w"
    with pytest.raises(pydantic.ValidationError, match="wal_uri and wal.uri disagree"):
        BrokerConfig(**BASE, wal_uri="file:///a", wal={"uri": "file:///b"})
    # a flat key joins the section's other settings
    both = BrokerConfig(**BASE, upload_interval_s=1.5, storage={"max_readers": 7})
    assert both.storage == StorageConfig(upload_interval_s=1.5, max_readers=7)


def test_unknown_keys_are_refused_at_every_level():
    for bad in (
        {"wal_capcity_bytes": 1},
        {"wal": {"capcity_bytes": 1}},
        {"wal": {"file": {"x": 1}}},
    ):
        with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
            BrokerConfig(**BASE, **bad)


def test_every_setting_of_every_section_can_be_given_in_the_file():
    given = {
        "storage": {"upload_interval_s": 0.5, "max_object_bytes": 32 << 20},
        "wal": {
            "capacity_bytes": 32 << 20,
            "file": {"linger_s": 0.001},
            "object": {"max_in_flight": 8},
        },
        "object_store": {"max_concurrency": 8, "read_timeout_ms": 5_000},
        "groups": {"group_initial_rebalance_delay_ms": 0},
        "zone_router": {"channel": {"linger_s": 0.01}},
        "erasure": {"shard_store_port": 19000, "seal": {"interval_ms": 500}},
    }
    cfg = BrokerConfig.model_validate_json(json.dumps({**BASE, **given}))
    assert cfg.storage.max_object_bytes == 32 << 20
    assert cfg.wal.file.linger_s == 0.001 and cfg.wal.object.max_in_flight == 8
    assert cfg.object_store.max_concurrency == 8 and cfg.object_store.read_timeout_ms == 5_000
    assert cfg.groups.group_initial_rebalance_delay_ms == 0
    assert cfg.zone_router.channel.linger_s == 0.01
    assert cfg.erasure.seal.interval_ms == 500
    # a section given in part keeps the defaults of the rest
    assert cfg.wal.file.max_queue_bytes == WALConfig().file.max_queue_bytes


def test_the_broker_object_store_defaults_to_its_own_concurrency():
    cfg = BrokerConfig(**BASE)
    assert cfg.object_store.max_concurrency == BROKER_OBJECT_STORE_CONCURRENCY
    # a section given without it still gets the library's default, as any other setting
    assert BrokerConfig(**BASE, object_store={"max_attempts": 2}).object_store.max_concurrency


def test_bounds_are_checked_in_sections():
    with pytest.raises(pydantic.ValidationError, match="capacity_bytes"):
        BrokerConfig(**BASE, wal={"capacity_bytes": 1024})
    with pytest.raises(pydantic.ValidationError, match="group_min_session_timeout_ms"):
        BrokerConfig(
            **BASE,
            groups={"group_min_session_timeout_ms": 10, "group_max_session_timeout_ms": 5},
        )


def test_the_engine_uploads_at_a_quarter_of_a_small_wal_at_the_latest():
    small = BrokerConfig(**BASE, wal={"capacity_bytes": 32 << 20})
    assert small.engine_storage().upload_threshold_bytes == 8 << 20
    big = BrokerConfig(**BASE)
    assert big.engine_storage() is big.storage


def _settings(model: type[pydantic.BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        yield prefix + name, field
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
            yield from _settings(ann, f"{prefix}{name}.")


def test_every_setting_is_described():
    missing = [key for key, field in _settings(BrokerConfig) if not field.description]
    assert not missing, missing


def test_the_reference_doc_is_current():
    """docs/configuration.md is generated: `python -m dataplane.config_reference`."""
    assert DOC_PATH.read_text() == reference_markdown(), (
        "docs/configuration.md is stale: run `python -m dataplane.config_reference`"
    )


def test_the_reference_lists_every_setting_with_its_default():
    text = reference_markdown()
    for key, field in _settings(BrokerConfig):
        ann = field.annotation
        section = isinstance(ann, type) and issubclass(ann, pydantic.BaseModel)
        assert (f"## `{key}`" if section else f"| `{key}` |") in text, key
    assert "| `wal.capacity_bytes` | int | `536870912 (512 MiB)` | ≥ 16777216 (16 MiB) |" in text
    assert "| `wal_capacity_bytes` | `wal.capacity_bytes` |" in text


def test_the_reference_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    monkeypatch.setattr("dataplane.config_reference.DOC_PATH", stale)
    assert main(["--check"]) == 1
    assert main([]) == 0 and main(["--check"]) == 0


def test_the_shard_store_delay_is_a_benchmark_environment_hook(monkeypatch):
    monkeypatch.delenv(INJECT_DELAY_ENV, raising=False)
    assert bench_inject_delay_ms() == 0
    monkeypatch.setenv(INJECT_DELAY_ENV, "250")
    assert bench_inject_delay_ms() == 250
    monkeypatch.setenv(INJECT_DELAY_ENV, "-1")
    with pytest.raises(ValueError, match=INJECT_DELAY_ENV):
        bench_inject_delay_ms()
    assert "shard_store_inject_delay_ms" not in BrokerConfig.model_fields
