"""Security against `automqctl cluster up --sasl` with real clients: kcat and confluent-kafka
over SCRAM-SHA-256/512, kafka-python and aiokafka over PLAIN (SASL_PLAINTEXT); wrong
passwords refused; ACLs enforced and changed with `automqctl acl`; users managed with
`automqctl user` and with Kafka's own admin API; the controller API closed; private files;
transactions across brokers by a non-super user with a TRANSACTIONAL_ID ACL.
One cluster (1 controller, 2 brokers) is shared by the module."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

APP_USER, APP_PASSWORD = "app", "app-password-1"


def automqctl(*args: str, cluster_dir: Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("sec") / "cluster"
    up = automqctl(
        "cluster", "up", "--sasl", "--brokers", "2", "--controllers", "1", "--format", "json",
        cluster_dir=d,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        status = json.loads(up.stdout)
        admin = json.loads((d / "admin.credentials").read_text())
        broker = json.loads((d / "broker.credentials").read_text())
        info = {
            "dir": d,
            "bootstrap": status["bootstrap_servers"],
            "admin": admin,
            "broker": broker,
        }
        # an application user allowed on the `sec-` topics and groups (prefixed ACLs)
        ok(automqctl("user", "add", APP_USER, "--password", APP_PASSWORD, cluster_dir=d))
        ok(
            automqctl(
                "acl", "add", "--allow-principal", f"User:{APP_USER}",
                "--operation", "Read", "--operation", "Write", "--operation", "Describe",
                "--topic", "sec-", "--resource-pattern-type", "prefixed", cluster_dir=d,
            )
        )  # fmt: skip
        ok(
            automqctl(
                "acl", "add", "--allow-principal", f"User:{APP_USER}", "--operation", "Read",
                "--group", "sec-", "--resource-pattern-type", "prefixed", cluster_dir=d,
            )
        )  # fmt: skip
        yield info
    finally:
        automqctl("cluster", "down", cluster_dir=d)


def rdkafka(cluster: dict, user: str, password: str, mechanism: str) -> dict:
    return {
        "bootstrap.servers": cluster["bootstrap"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def admin_rdkafka(cluster: dict) -> dict:
    a = cluster["admin"]
    return rdkafka(cluster, a["username"], a["password"], a["mechanism"])


def create_topic(cluster: dict, name: str, partitions: int = 2) -> None:
    admin = AdminClient(admin_rdkafka(cluster))
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if t and t.error is None and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not ready")


def produce(config: dict, topic: str, values: list[bytes]) -> list:
    """Produce; the delivery errors (empty: all acknowledged)."""
    errors: list = []
    producer = Producer({**config, "linger.ms": 5, "message.timeout.ms": 15_000})
    for v in values:
        producer.produce(topic, value=v, on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0
    return errors


def consume(config: dict, topic: str, expected: int, timeout_s: float = 30) -> list[bytes]:
    consumer = Consumer(
        {
            **config,
            "group.id": f"sec-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
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


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_scram_produce_consume(cluster, mechanism):
    topic = f"sec-confluent-{mechanism.lower()}"
    create_topic(cluster, topic)
    config = rdkafka(cluster, APP_USER, APP_PASSWORD, mechanism)
    values = [b"m-%d" % i for i in range(50)]
    assert produce(config, topic, values) == []
    assert sorted(consume(config, topic, len(values))) == sorted(values)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_scram_produce_consume(cluster, mechanism):
    topic = f"sec-kcat-{mechanism.lower()}"
    create_topic(cluster, topic, partitions=1)
    auth = [
        "-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanism={mechanism}",
        "-X", f"sasl.username={APP_USER}", "-X", f"sasl.password={APP_PASSWORD}",
    ]  # fmt: skip
    lines = [f"kcat-{i}" for i in range(20)]
    subprocess.run(
        ["kcat", "-P", "-b", cluster["bootstrap"], "-t", topic, *auth],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=60,
    )
    out = subprocess.run(
        ["kcat", "-C", "-b", cluster["bootstrap"], "-t", topic, "-e", "-o", "beginning", *auth],
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == lines
    # a wrong password: refused, nothing produced
    bad = subprocess.run(
        ["kcat", "-L", "-b", cluster["bootstrap"], *auth[:-1], "sasl.password=wrong-one"],
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert "Authentication failed" in bad.stderr or "authentication" in bad.stderr.lower()


def test_kafka_python_plain_produce_consume(cluster):
    from kafka import KafkaConsumer, KafkaProducer

    topic = "sec-kafka-python"
    create_topic(cluster, topic)
    auth = {
        "bootstrap_servers": cluster["bootstrap"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": APP_USER,
        "sasl_plain_password": APP_PASSWORD,
    }
    producer = KafkaProducer(**auth)
    values = [b"kp-%d" % i for i in range(30)]
    for f in [producer.send(topic, v) for v in values]:
        f.get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        group_id="sec-kafka-python",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15_000,
        **auth,
    )
    got = []
    for msg in consumer:
        got.append(msg.value)
        if len(got) == len(values):
            break
    consumer.close()
    assert sorted(got) == sorted(values)


def test_aiokafka_plain_produce_consume(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = "sec-aiokafka"
    create_topic(cluster, topic)
    auth = {
        "bootstrap_servers": cluster["bootstrap"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": APP_USER,
        "sasl_plain_password": APP_PASSWORD,
    }
    values = [b"ak-%d" % i for i in range(30)]

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(**auth)
        await producer.start()
        try:
            for v in values:
                await producer.send_and_wait(topic, v)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, group_id="sec-aiokafka", auto_offset_reset="earliest", **auth
        )
        await consumer.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(30):
                async for msg in consumer:
                    got.append(msg.value)
                    if len(got) == len(values):
                        break
        finally:
            await consumer.stop()
        return got

    assert sorted(asyncio.run(run())) == sorted(values)


def _failures_metric(cluster: dict) -> float:
    """Failed logins counted by all brokers (a client may try either)."""
    config = json.loads((cluster["dir"] / "cluster.json").read_text())
    total = 0.0
    for broker in config["brokers"]:
        url = f"http://127.0.0.1:{broker['metrics_port']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kafka_sasl_authentication_failures_total{")
        )
    return total


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_wrong_password_is_refused_logged_and_counted(cluster, mechanism):
    before = _failures_metric(cluster)
    admin = AdminClient(rdkafka(cluster, APP_USER, "not-the-password", mechanism))
    with pytest.raises(confluent_kafka.KafkaException) as exc:
        admin.list_topics(timeout=3)
    assert exc.value.args[0].code() in (
        KafkaError._AUTHENTICATION,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    )
    assert _failures_metric(cluster) > before
    log = "".join(p.read_text() for p in (cluster["dir"] / "logs").glob("broker-*.log"))
    assert f"failed SASL {mechanism} login from 127.0.0.1" in log
    assert "not-the-password" not in log


def test_write_needs_an_acl_then_acl_add_allows_it(cluster):
    d = cluster["dir"]
    topic = "orders"
    create_topic(cluster, topic, partitions=1)
    ok(automqctl("user", "add", "bob", "--password", "bob-password-1", cluster_dir=d))
    bob = rdkafka(cluster, "bob", "bob-password-1", "SCRAM-SHA-512")
    errors = produce(bob, topic, [b"denied"])
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    ok(
        automqctl(
            "acl", "add", "--allow-principal", "User:bob", "--operation", "Write",
            "--topic", topic, cluster_dir=d,
        )
    )  # fmt: skip
    listed = json.loads(
        ok(automqctl("acl", "list", "--principal", "User:bob", "--format", "json", cluster_dir=d))
    )
    assert [(a["operation"], a["resource_name"]) for a in listed] == [("WRITE", topic)]
    assert produce(bob, topic, [b"allowed"]) == []

    # reading still needs READ: the consumer gets TOPIC_AUTHORIZATION_FAILED, not data
    consumer = Consumer({**bob, "group.id": "bob-group", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen_error = None
    deadline = time.monotonic() + 20
    try:
        while seen_error is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error():
                seen_error = msg.error().code()
            assert msg is None or msg.error(), "bob read data without a READ ACL"
    finally:
        consumer.close()
    assert seen_error in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    )

    ok(
        automqctl(
            "acl", "remove", "--allow-principal", "User:bob", "--operation", "Write",
            "--topic", topic, cluster_dir=d,
        )
    )  # fmt: skip
    errors = produce(bob, topic, [b"denied-again"])
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_kafka_admin_api_manages_users_and_acls(cluster):
    admin = AdminClient(admin_rdkafka(cluster))
    upsert = UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-password-1"
    )
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(30)
    described = admin.describe_user_scram_credentials(["carol"])["carol"].result(30)
    info = described.scram_credential_infos[0]
    assert (info.mechanism, info.iterations) == (ScramMechanism.SCRAM_SHA_256, 8192)
    users = ok(automqctl("user", "list", "--format", "json", cluster_dir=cluster["dir"]))
    assert "carol" in [u["user"] for u in json.loads(users)]

    # carol logs in with what Kafka's admin API stored; she may do nothing yet
    carol = AdminClient(rdkafka(cluster, "carol", "carol-password-1", "SCRAM-SHA-256"))
    md = carol.list_topics(timeout=10)  # authenticated: Metadata answers (without topics)
    assert "orders" not in md.topics
    denied = AdminClient(rdkafka(cluster, "carol", APP_PASSWORD, "SCRAM-SHA-256"))
    with pytest.raises(confluent_kafka.KafkaException):
        denied.list_topics(timeout=5)
    # a non-super user cannot manage users
    with pytest.raises(confluent_kafka.KafkaException) as exc:
        for f in carol.alter_user_scram_credentials([upsert]).values():
            f.result(30)
    assert exc.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_controller_api_and_files_are_closed(cluster):
    d = cluster["dir"]
    config = json.loads((d / "cluster.json").read_text())
    api = f"127.0.0.1:{config['controllers'][0]['api_port']}"
    for path in ("/v1/image", "/v1/status", "/metrics"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"http://{api}{path}", timeout=10)
        assert exc.value.code == 401
    req = urllib.request.Request(
        f"http://{api}/v1/create_topic", data=b'{"name": "stolen", "partitions": 1}'
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10)
    assert exc.value.code == 401
    # the CLI authenticates with the cluster's secret
    ok(automqctl("cluster", "status", "--format", "json", cluster_dir=d))
    assert "stolen" not in ok(automqctl("topic", "list", cluster_dir=d))

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(d) == 0o700
    private = ("cluster.json", "quorum.json", "controller-api.secret", "admin.credentials")
    for name in (*private, "broker.credentials", "broker-1/broker.json"):
        assert mode(d / name) == 0o600, name
    for log in (d / "logs").glob("*.log"):
        assert mode(log) & 0o077 == 0, log
    secret = (d / "controller-api.secret").read_text().strip()
    for log in (d / "logs").glob("*.log"):
        text = log.read_text(errors="replace")
        assert secret not in text and cluster["admin"]["password"] not in text, log
        assert cluster["broker"]["password"] not in text, log
        assert APP_PASSWORD not in text, log
    for pid in (d / "pids").glob("*.pid"):
        cmdline = Path(f"/proc/{pid.read_text().split()[0]}/cmdline").read_bytes()
        assert secret.encode() not in cmdline
        assert cluster["admin"]["password"].encode() not in cmdline
        assert cluster["broker"]["password"].encode() not in cmdline


def test_object_store_serves_object_data_only_through_s3(cluster):
    """The filer and volume HTTP ports refuse anonymous reads and writes (JWT-protected);
    the S3 API, with the cluster's credentials, is the only way to object data."""
    config = json.loads((cluster["dir"] / "cluster.json").read_text())
    ports = config["embedded_s3"]["ports"]
    filer, volume = f"127.0.0.1:{ports['filer']}", f"127.0.0.1:{ports['volume']}"
    for url in (
        f"http://{filer}/",
        f"http://{filer}/buckets/",
        f"http://{filer}/buckets/automq-main/",
        f"http://{volume}/1,0123456789",
        f"http://{volume}/2,0123456789",
    ):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(url, timeout=10)
        assert exc.value.code == 401, url
    upload = urllib.request.Request(
        f"http://{filer}/buckets/automq-main/x", data=b"x", method="PUT"
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(upload, timeout=10)
    assert exc.value.code == 401
    # while the brokers' S3 uploads work: data produced earlier is in the bucket
    import boto3
    from botocore.config import Config

    s3 = config["embedded_s3"]
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{ports['s3']}",
        aws_access_key_id=s3["access_key"],
        aws_secret_access_key=s3["secret_key"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )
    client.put_object(Bucket="automq-main", Key="probe/x", Body=b"probe")
    assert client.get_object(Bucket="automq-main", Key="probe/x")["Body"].read() == b"probe"
    client.delete_object(Bucket="automq-main", Key="probe/x")
    assert stat.S_IMODE((Path(s3["data_dir"]) / "security.toml").stat().st_mode) == 0o600


def test_transaction_across_brokers_needs_a_transactional_id_acl(cluster):
    """A non-super user's transaction over partitions led by both brokers: refused at
    init_transactions without WRITE on the transactional id; with it (`automqctl acl add
    --transactional-id`) the commit's markers reach the other broker (inter-broker SASL as
    the broker user) and a read_committed consumer sees exactly the committed records."""
    from confluent_kafka import KafkaException

    d = cluster["dir"]
    topic = f"sec-txn-{uuid.uuid4().hex[:6]}"
    create_topic(cluster, topic, partitions=4)
    meta = AdminClient(admin_rdkafka(cluster)).list_topics(topic, timeout=10).topics[topic]
    leaders = {p.id: p.leader for p in meta.partitions.values()}
    # one partition led by each broker: the coordinator is on one of them, so the markers
    # of at least one partition go to the other broker over its SASL listener
    by_leader = {leader: pid for pid, leader in sorted(leaders.items())}
    assert len(by_leader) == 2, leaders
    parts = sorted(by_leader.values())
    txn_id = f"sec-tx-{uuid.uuid4().hex[:6]}"
    app = rdkafka(cluster, APP_USER, APP_PASSWORD, "SCRAM-SHA-512")
    tx_config = {**app, "transactional.id": txn_id, "transaction.timeout.ms": 60_000}

    denied = Producer(tx_config)
    with pytest.raises(KafkaException) as refused:
        denied.init_transactions(20)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    del denied

    ok(
        automqctl(
            "acl", "add", "--allow-principal", f"User:{APP_USER}", "--operation", "Write",
            "--transactional-id", txn_id, cluster_dir=d,
        )
    )  # fmt: skip
    producer = Producer(tx_config)
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(topic, value=b"c-%d" % i, partition=parts[i % 2])
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"ab-%d" % i, partition=parts[i % 2])
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"last", partition=parts[1])
    producer.produce(topic, value=b"last", partition=parts[0])
    producer.commit_transaction(30)

    consumer = Consumer(
        {
            **app,
            "group.id": f"sec-rc-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        # 22 committed records; then a second of nothing more (no aborted record leaks)
        quiet_until = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.value())
                quiet_until = None
            elif len(got) >= 22:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    assert sorted(got) == sorted([b"c-%d" % i for i in range(20)] + [b"last", b"last"])
