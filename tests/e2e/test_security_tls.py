"""SASL_SSL: `automqctl cluster up --sasl --tls` (a generated CA and broker certificate);
kcat and confluent-kafka with SCRAM-SHA-256/512, kafka-python and aiokafka with PLAIN
produce and consume over TLS; a plaintext client gets nothing. One cluster per module."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess

import pytest

from tests.e2e.test_security import (
    APP_PASSWORD,
    APP_USER,
    automqctl,
    consume,
    create_topic,
    ok,
    produce,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls") / "cluster"
    up = automqctl(
        "cluster", "up", "--sasl", "--tls", "--brokers", "1", "--controllers", "1",
        "--format", "json", cluster_dir=d,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        admin = json.loads((d / "admin.credentials").read_text())
        assert admin["security_protocol"] == "SASL_SSL"
        ok(automqctl("user", "add", APP_USER, "--password", APP_PASSWORD, cluster_dir=d))
        ok(
            automqctl(
                "acl", "add", "--allow-principal", f"User:{APP_USER}", "--operation", "All",
                "--topic", "tls-", "--group", "sec-", "--resource-pattern-type", "prefixed",
                cluster_dir=d,
            )
        )  # fmt: skip
        yield {
            "dir": d,
            "bootstrap": json.loads(up.stdout)["bootstrap_servers"],
            "admin": admin,
            "ca": str(d / "tls" / "ca.pem"),
        }
    finally:
        automqctl("cluster", "down", cluster_dir=d)


def sasl_ssl(cluster: dict, mechanism: str) -> dict:
    return {
        "bootstrap.servers": cluster["bootstrap"],
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": cluster["ca"],
        "sasl.mechanism": mechanism,
        "sasl.username": APP_USER,
        "sasl.password": APP_PASSWORD,
    }


@pytest.fixture(autouse=True)
def _admin_config(monkeypatch, cluster):
    # create_topic of the plaintext module builds its config with admin_rdkafka: add the CA
    import tests.e2e.test_security as base

    a = cluster["admin"]
    monkeypatch.setattr(
        base,
        "admin_rdkafka",
        lambda c: {
            **base.rdkafka(c, a["username"], a["password"], a["mechanism"]),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": cluster["ca"],
        },
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_over_sasl_ssl(cluster, mechanism):
    topic = f"tls-confluent-{mechanism.lower()}"
    create_topic(cluster, topic, partitions=1)
    config = sasl_ssl(cluster, mechanism)
    values = [b"tls-%d" % i for i in range(20)]
    assert produce(config, topic, values) == []
    assert sorted(consume(config, topic, len(values))) == sorted(values)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_over_sasl_ssl(cluster):
    topic = "tls-kcat"
    create_topic(cluster, topic, partitions=1)
    auth = [
        "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={cluster['ca']}",
        "-X", "sasl.mechanism=SCRAM-SHA-512", "-X", f"sasl.username={APP_USER}",
        "-X", f"sasl.password={APP_PASSWORD}",
    ]  # fmt: skip
    subprocess.run(
        ["kcat", "-P", "-b", cluster["bootstrap"], "-t", topic, *auth],
        input="a\nb\nc\n",
        text=True,
        check=True,
        timeout=60,
    )
    out = subprocess.run(
        ["kcat", "-C", "-b", cluster["bootstrap"], "-t", topic, "-e", *auth],
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == ["a", "b", "c"]
    # a plaintext client gets no answer from the TLS listener
    plain = subprocess.run(
        ["kcat", "-L", "-m", "3", "-b", cluster["bootstrap"], *auth[2:]],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert plain.returncode != 0


def test_kafka_python_and_aiokafka_plain_over_sasl_ssl(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from kafka import KafkaConsumer, KafkaProducer

    topic = "tls-python"
    create_topic(cluster, topic, partitions=1)
    auth = {
        "bootstrap_servers": cluster["bootstrap"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": APP_USER,
        "sasl_plain_password": APP_PASSWORD,
    }
    producer = KafkaProducer(ssl_cafile=cluster["ca"], **auth)
    for f in [producer.send(topic, b"kp-%d" % i) for i in range(10)]:
        f.get(timeout=30)
    producer.close()

    async def run() -> list[bytes]:
        context = ssl.create_default_context(cafile=cluster["ca"])
        p = AIOKafkaProducer(ssl_context=context, **auth)
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait(topic, b"ak-%d" % i)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            topic,
            group_id="sec-tls-aiokafka",
            auto_offset_reset="earliest",
            ssl_context=context,
            **auth,
        )
        await c.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                async for msg in c:
                    got.append(msg.value)
                    if len(got) == 20:
                        break
        finally:
            await c.stop()
        return got

    got = asyncio.run(run())
    assert sorted(got) == sorted(
        [b"kp-%d" % i for i in range(10)] + [b"ak-%d" % i for i in range(10)]
    )

    consumer = KafkaConsumer(
        topic,
        group_id="sec-tls-kafka-python",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15_000,
        ssl_cafile=cluster["ca"],
        **auth,
    )
    seen = []
    for msg in consumer:
        seen.append(msg.value)
        if len(seen) == 20:
            break
    consumer.close()
    assert sorted(seen) == sorted(got)


def test_the_controller_api_is_https_with_the_cluster_ca(cluster):
    """`cluster up --tls` serves the controller API over HTTPS with the same CA: a client
    that trusts it works (the CLI, brokers), plain HTTP and an untrusting client get
    nothing, and the secret is still required."""
    import http.client

    from cli.local_cluster import LocalCluster
    from controlplane.client import ControllerClient
    from controlplane.errors import ControllerError

    config = LocalCluster(cluster["dir"]).load()
    assert config.controller_ca_file == cluster["ca"]
    address = config.quorum_config().api_addresses()[0]
    host, port = address.rsplit(":", 1)
    trusted = ControllerClient(
        [address], api_secret=config.api_secret, ca_file=cluster["ca"], timeout_s=10
    )
    assert trusted.status(address)["raft"]["state"] == "leader"
    # plain HTTP to the HTTPS port: no answer
    plain = http.client.HTTPConnection(host, int(port), timeout=5)
    with pytest.raises((OSError, http.client.HTTPException)):
        plain.request("GET", "/v1/status")
        plain.getresponse().read()
    plain.close()
    # HTTPS without trusting the cluster CA: refused by the client's verification
    untrusting = http.client.HTTPSConnection(
        host, int(port), timeout=5, context=ssl.create_default_context()
    )
    with pytest.raises(ssl.SSLError):
        untrusting.request("GET", "/v1/status")
    untrusting.close()
    # the right CA and no secret: 401 as before
    anonymous = ControllerClient([address], api_secret="", ca_file=cluster["ca"], timeout_s=5)
    with pytest.raises(ControllerError) as exc:
        anonymous.call("put_kv", {"key": "x", "value": "y"})
    assert exc.value.code.name == "UNAUTHORIZED"
    status = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "healthy"
