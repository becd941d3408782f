"""Per-listener security protocol on a real cluster: `automqctl cluster up --sasl --tls --mtls
--listeners PLAINTEXT,SASL_SSL,SSL` gives each broker three sockets. confluent-kafka over
PLAINTEXT (principal User:ANONYMOUS, as in Kafka, allowed by an ACL) and kafka-python over
SASL_SSL both produce and consume, and the metadata each client gets lists only the endpoints
of the listener it connected on. A SASL login on the PLAINTEXT listener is refused. The SSL
listener is mutual TLS: no client certificate, no service; a certificate's CN is the
principal, refused without an ACL and served after `automqctl acl add`."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.test_security import APP_PASSWORD, APP_USER, automqctl, ok, produce

pytestmark = [pytest.mark.e2e]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOPIC = "lst-orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("listeners") / "cluster"
    up = automqctl(
        "cluster", "up", "--sasl", "--tls", "--mtls", "--listeners", "PLAINTEXT,SASL_SSL,SSL",
        "--brokers", "2", "--controllers", "1", "--wal-capacity-mib", "16", "--format", "json",
        cluster_dir=d,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        ok(automqctl("user", "add", APP_USER, "--password", APP_PASSWORD, cluster_dir=d))
        for principal in (f"User:{APP_USER}", "User:ANONYMOUS"):
            ok(
                automqctl(
                    "acl", "add", "--allow-principal", principal, "--operation", "All",
                    "--topic", "lst-", "--group", "lst-", "--resource-pattern-type", "prefixed",
                    cluster_dir=d,
                )
            )  # fmt: skip
        yield {
            "dir": d,
            "status": json.loads(up.stdout),
            "admin": json.loads((d / "admin.credentials").read_text()),
            "ca": str(d / "tls" / "ca.pem"),
        }
    finally:
        automqctl("cluster", "down", cluster_dir=d)


def consume(config: dict, expected: int, timeout_s: float = 30) -> list[bytes]:
    consumer = Consumer({**config, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def sasl_ssl_admin(cluster: dict, listeners: dict) -> AdminClient:
    """The cluster's admin (a super user) over the SASL_SSL listener."""
    a = cluster["admin"]
    return AdminClient(
        {
            "bootstrap.servers": listeners["SASL_SSL"]["bootstrap_servers"],
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": cluster["ca"],
            "sasl.mechanism": a["mechanism"],
            "sasl.username": a["username"],
            "sasl.password": a["password"],
        }
    )


def addresses(servers: str) -> set[tuple[str, int]]:
    return {(h, int(p)) for h, p in (s.rsplit(":", 1) for s in servers.split(","))}


def test_two_listeners_each_client_sees_only_its_own(cluster):
    status = cluster["status"]
    listeners = status["listeners"]
    assert {n: v["security_protocol"] for n, v in listeners.items()} == {
        "PLAINTEXT": "PLAINTEXT",
        "SASL_SSL": "SASL_SSL",
        "SSL": "SSL",
    }
    plain = addresses(listeners["PLAINTEXT"]["bootstrap_servers"])
    sasl_ssl = addresses(listeners["SASL_SSL"]["bootstrap_servers"])
    assert len(plain) == len(sasl_ssl) == 2 and not plain & sasl_ssl
    # cluster status: every broker's registered endpoints, one per listener
    for b in status["brokers"]:
        assert sorted(e["listener"] for e in b["endpoints"]) == ["PLAINTEXT", "SASL_SSL", "SSL"]
    shown = ok(automqctl("cluster", "status", cluster_dir=cluster["dir"]))
    assert "PLAINTEXT 127.0.0.1:" in shown and "SASL_SSL 127.0.0.1:" in shown

    # the admin (SASL_SSL, a super user) creates the topic: one partition on each broker
    admin = sasl_ssl_admin(cluster, listeners)
    admin.create_topics([NewTopic(TOPIC, 2, 1)], operation_timeout=30)[TOPIC].result(30)

    # confluent-kafka over PLAINTEXT: the brokers it is told about are PLAINTEXT endpoints
    plain_config = {"bootstrap.servers": listeners["PLAINTEXT"]["bootstrap_servers"]}
    deadline = time.monotonic() + 30
    while True:
        md = AdminClient(plain_config).list_topics(TOPIC, timeout=10)
        t = md.topics.get(TOPIC)
        if t and t.error is None and all(p.leader >= 0 for p in t.partitions.values()):
            break
        assert time.monotonic() < deadline, f"topic not ready: {t and t.error}"
        time.sleep(0.2)
    assert {(b.host, b.port) for b in md.brokers.values()} == plain
    plain_admin = AdminClient(plain_config)  # kept alive until the answer is in
    described = plain_admin.describe_cluster(request_timeout=10).result(15)
    assert {(n.host, n.port) for n in described.nodes} == plain
    values = [b"plain-%d" % i for i in range(20)]
    assert produce(plain_config, TOPIC, values) == []

    # kafka-python over SASL_SSL: told only about SASL_SSL endpoints; reads what PLAINTEXT wrote
    from kafka import KafkaConsumer, KafkaProducer

    auth = {
        "bootstrap_servers": listeners["SASL_SSL"]["bootstrap_servers"],
        "security_protocol": "SASL_SSL",
        "ssl_cafile": cluster["ca"],
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": APP_USER,
        "sasl_plain_password": APP_PASSWORD,
    }
    producer = KafkaProducer(**auth)
    try:
        for f in [producer.send(TOPIC, b"sasl-%d" % i) for i in range(20)]:
            f.get(timeout=30)
        brokers = {(b.host, b.port) for b in producer._metadata.brokers()}
    finally:
        producer.close()
    assert brokers == sasl_ssl
    consumer = KafkaConsumer(
        TOPIC,
        group_id="lst-kafka-python",
        auto_offset_reset="earliest",
        consumer_timeout_ms=20_000,
        **auth,
    )
    seen = []
    try:
        for msg in consumer:
            seen.append(msg.value)
            if len(seen) == 40:
                break
    finally:
        consumer.close()
    everything = sorted(values + [b"sasl-%d" % i for i in range(20)])
    assert sorted(seen) == everything
    # and confluent-kafka over PLAINTEXT reads what SASL_SSL wrote (its group coordinator is
    # found on the PLAINTEXT listener)
    assert sorted(consume({**plain_config, "group.id": "lst-confluent"}, 40)) == everything

    # a SASL login on the PLAINTEXT listener is refused: it stays User:ANONYMOUS's
    sneaky = AdminClient(
        {
            **plain_config,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": cluster["admin"]["username"],
            "sasl.password": cluster["admin"]["password"],
        }
    )
    with pytest.raises(confluent_kafka.KafkaException):
        sneaky.list_topics(timeout=5)


def test_mutual_tls_listener_principal_is_the_certificate_cn(cluster):
    """`--mtls`: the SSL listener wants a client certificate of the cluster CA; User:<CN>
    needs an ACL like any principal."""
    from confluent_kafka import Producer

    d = cluster["dir"]
    listeners = cluster["status"]["listeners"]
    carol = json.loads(ok(automqctl("user", "cert", "carol", "--format", "json", cluster_dir=d)))
    assert carol["principal"] == "User:carol"
    ssl_config = {
        "bootstrap.servers": listeners["SSL"]["bootstrap_servers"],
        "security.protocol": "SSL",
        "ssl.ca.location": carol["ca"],
        "ssl.certificate.location": carol["certificate"],
        "ssl.key.location": carol["key"],
    }
    topic = "mtls-orders"
    md = AdminClient(ssl_config).list_topics(timeout=10)
    assert {(b.host, b.port) for b in md.brokers.values()} == addresses(
        listeners["SSL"]["bootstrap_servers"]
    )
    # no ACL for User:carol: the write is refused with TOPIC_AUTHORIZATION_FAILED
    admin = sasl_ssl_admin(cluster, listeners)
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=30)[topic].result(30)
    errors: list = []
    producer = Producer({**ssl_config, "message.timeout.ms": 10_000})
    producer.produce(topic, b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    ok(
        automqctl(
            "acl", "add", "--allow-principal", "User:carol", "--operation", "Write",
            "--operation", "Describe", "--topic", topic, cluster_dir=d,
        )
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        errors = produce(ssl_config, topic, [b"from-carol"])
        if not errors or time.monotonic() > deadline:
            break
        time.sleep(0.3)  # the brokers apply the ACL record a moment later
    assert errors == []
    # without a client certificate the SSL listener serves nothing
    anonymous = {k: v for k, v in ssl_config.items() if "certificate" not in k and "key." not in k}
    with pytest.raises(confluent_kafka.KafkaException):
        AdminClient(anonymous).list_topics(timeout=5)


def test_mutual_tls_alone_cli_and_clients_by_certificate(tmp_path):
    """`cluster up --tls --mtls` without SASL: one SSL listener wanting client certificates,
    ACLs on; the CLI works as the admin's certificate, an application's certificate needs
    an ACL."""
    from confluent_kafka import Producer

    d = tmp_path / "mtls"
    up = automqctl(
        "cluster", "up", "--tls", "--mtls", "--brokers", "1", "--controllers", "1",
        "--wal-capacity-mib", "16", "--format", "json", cluster_dir=d,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        status = json.loads(up.stdout)
        assert list(status["listeners"]) == ["SSL"]
        ok(automqctl("topic", "create", "mtls-t", "--partitions", "1", cluster_dir=d))
        bob = json.loads(ok(automqctl("user", "cert", "bob", "--format", "json", cluster_dir=d)))
        config = {
            "bootstrap.servers": status["bootstrap_servers"],
            "security.protocol": "SSL",
            "ssl.ca.location": bob["ca"],
            "ssl.certificate.location": bob["certificate"],
            "ssl.key.location": bob["key"],
            "message.timeout.ms": 10_000,
        }
        errors: list = []
        producer = Producer(config)
        producer.produce("mtls-t", b"x", on_delivery=lambda err, msg: errors.append(err))
        producer.flush(15)
        assert errors[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
        ok(
            automqctl(
                "acl", "add", "--allow-principal", "User:bob", "--operation", "Write",
                "--operation", "Describe", "--topic", "mtls-t", cluster_dir=d,
            )
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while (errors := produce(config, "mtls-t", [b"from-bob"])) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert errors == []
    finally:
        automqctl("cluster", "down", cluster_dir=d)
