"""What `cluster up --sasl --tls` writes: a private directory, the controller API secret,
a CA and broker certificate a TLS client verifies, the flags fixed at creation; and a
config written before the secret existed gets one."""

from __future__ import annotations

import os
import socket
import ssl
import stat
import threading

import pytest

from cli.cluster_config import ClusterConfig
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from dataplane.kafka.security.tls import server_ssl_context

BUCKETS = "0@s3://main?region=us-east-1&endpoint=http://127.0.0.1:9"


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def secured(tmp_path) -> tuple[LocalCluster, ClusterConfig]:
    cluster = LocalCluster(tmp_path / "c")
    config = cluster.create(1, 1, ["az1"], None, BUCKETS, 6000, sasl=True, tls=True)
    return cluster, config


def test_files_are_private_and_the_secret_is_stored(secured):
    cluster, config = secured
    assert mode(cluster.dir) == 0o700
    assert config.api_secret and len(config.api_secret) >= 16
    assert cluster.api_secret_path.read_text().strip() == config.api_secret
    assert mode(cluster.api_secret_path) == 0o600
    assert mode(cluster.config_path) == 0o600
    assert config.quorum_config().api_secret == config.api_secret
    assert mode(cluster.tls_dir) == 0o700
    assert mode(cluster.tls_dir / "server.key") == 0o600
    assert mode(cluster.tls_dir / "ca.key") == 0o600
    assert config.security_protocol == "SASL_SSL"


def test_the_flags_are_fixed_at_creation(secured):
    _, config = secured
    assert flag_differences(config, sasl=True, tls=True) == []
    differ = flag_differences(config, sasl=False, tls=False)
    assert len(differ) == 2 and "--no-sasl" in differ[0] and "--no-tls" in differ[1]


def test_an_old_config_gets_a_secret(tmp_path):
    cluster = LocalCluster(tmp_path / "old")
    config = cluster.create(1, 1, ["az1"], None, BUCKETS, 6000)
    config.api_secret = None
    cluster.save(config)
    cluster.ensure_api_secret(config)
    assert config.api_secret and cluster.load().api_secret == config.api_secret
    assert cluster.api_secret_path.read_text().strip() == config.api_secret


def test_a_client_trusting_the_ca_verifies_the_broker_certificate(secured):
    cluster, _ = secured
    server_ctx = server_ssl_context(cluster.tls_dir / "server.pem", cluster.tls_dir / "server.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    errors: list[Exception] = []

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(tls.recv(5))
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    for host in ("127.0.0.1", "localhost"):
        t = threading.Thread(target=serve)
        t.start()
        client_ctx = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(b"hello")
                assert tls.recv(5) == b"hello"
        t.join(5)
    # a client that does not trust the CA refuses the certificate
    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
    t.join(5)
    listener.close()
    assert len(errors) == 1  # only the untrusting client's handshake failed


def test_brokers_get_their_own_super_user_login_privately(secured, monkeypatch):
    """The `broker` login (inter-broker WriteTxnMarkers) is in DIR/broker.credentials and in
    each broker's config (both 0600), never in its argv; the broker trusts the cluster CA."""
    import json

    from dataplane.config import BrokerConfig

    cluster, config = secured
    creds = cluster.create_broker_credentials()
    assert mode(cluster.broker_credentials_path) == 0o600
    assert creds["username"] == "broker" and len(creds["password"]) >= 16
    assert cluster.broker_credentials() == creds
    argvs: list[list[str]] = []
    monkeypatch.setattr(cluster, "_spawn", lambda name, argv, cwd=None: argvs.append(argv) or 1)
    cluster.start_broker(config, config.brokers[0].node_id)
    path = cluster.dir / f"broker-{config.brokers[0].node_id}" / "broker.json"
    assert mode(path) == 0o600
    bcfg = BrokerConfig(**json.loads(path.read_text()))
    assert set(bcfg.super_users) == {"User:admin", "User:broker"}
    assert (bcfg.inter_broker_sasl_username, bcfg.inter_broker_sasl_password) == (
        "broker",
        creds["password"],
    )
    assert bcfg.tls_ca_file == cluster.tls_dir / "ca.pem"
    assert creds["password"] not in repr(bcfg)
    assert not any(creds["password"] in a for a in argvs[0])


def test_the_table_sync_job_gets_the_admin_login_by_its_environment_only(secured, tmp_path):
    """A SASL/TLS cluster has no PLAINTEXT listener: the table sync's ListOffsets needs the
    admin's login, handed to the job in its environment, never written to job.json."""
    import json

    from cli import table_jobs
    from dataplane.tables.spec import SYNC_KAFKA_CLIENT_ENV

    cluster, config = secured
    cluster.create_admin_credentials(config)  # as `cluster up` makes it
    env = table_jobs.kafka_client_env(cluster.dir, config)
    settings = json.loads(env[SYNC_KAFKA_CLIENT_ENV])
    assert settings["security.protocol"] == "SASL_SSL"
    assert settings["sasl.username"] == "admin" and settings["sasl.password"]
    assert settings["bootstrap.servers"] == config.bootstrap_servers()
    job = json.dumps(table_jobs.job_config(cluster.dir, config, "local[1]", []))
    assert settings["sasl.password"] not in job
    plain = LocalCluster(tmp_path / "plain")
    plain_config = plain.create(1, 1, ["az1"], None, BUCKETS, 6000)
    assert table_jobs.kafka_client_env(plain.dir, plain_config) == {}
