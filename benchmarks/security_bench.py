"""What security costs: a login per SASL mechanism against a real KafkaServer (TCP on
127.0.0.1, the broker's SASL handlers; the client side is this script's own RFC 5802 client),
against the baseline of a plaintext connection's first Metadata answer, and one ACL decision
with many ACLs. Medians of `--logins` runs.

Run: python benchmarks/security_bench.py [--logins 50] [--acls 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.records import AclBinding  # noqa: E402
from controlplane.requests import AlterScramCredentialsRequest  # noqa: E402
from controlplane.security import scram_upsertion  # noqa: E402
from controlplane.state_machine import MetadataStateMachine  # noqa: E402
from dataplane.kafka.security.authorizer import Authorizer  # noqa: E402
from dataplane.kafka.security.sasl import SaslAuthenticator  # noqa: E402
from dataplane.kafka.security.throttle import LoginThrottle  # noqa: E402
from tests.integration.test_kafka_sasl import (  # noqa: E402
    PASSWORD,
    authenticate,
    handshake,
    scram_login,
)
from tests.integration.test_kafka_server import Cluster, Raw, make_registry, running  # noqa: E402


def _ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logins", type=int, default=50)
    parser.add_argument("--acls", type=int, default=1000)
    args = parser.parse_args()

    machine = MetadataStateMachine()
    req = AlterScramCredentialsRequest(
        upsertions=[
            scram_upsertion("alice", m, PASSWORD) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
        ]
    )
    machine.execute(req.command, req.model_dump(mode="json"), 0)
    sasl = SaslAuthenticator(lambda: machine.image, throttle=LoginThrottle())
    results: dict[str, float] = {}

    plain_cluster = Cluster()
    with running(make_registry(plain_cluster), plain_cluster) as server:
        samples = []
        for i in range(args.logins):
            start = time.perf_counter()
            c = Raw(server.port)
            c.metadata(i)
            samples.append(time.perf_counter() - start)
            c.close()
        results["plaintext connect + Metadata (baseline)"] = _ms(samples)

    cluster = Cluster()
    registry = make_registry(cluster)
    for cls, lo, hi, handler in sasl.registrations():
        registry.register(cls, lo, hi, handler)
    with running(registry, cluster, admit=sasl.admit) as server:
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            samples = []
            for i in range(args.logins):
                start = time.perf_counter()
                c = Raw(server.port)
                if mechanism == "PLAIN":
                    assert handshake(c, "PLAIN").error_code == 0
                    assert authenticate(c, b"\0alice\0" + PASSWORD.encode()).error_code == 0
                else:
                    assert scram_login(c, "alice", PASSWORD, mechanism) == 0
                c.metadata(i)
                samples.append(time.perf_counter() - start)
                c.close()
            results[f"{mechanism} login + Metadata"] = _ms(samples)

    acls = [
        AclBinding(
            resource_type="TOPIC",
            resource_name=f"topic-{i}",
            principal=f"User:u{i % 50}",
            operation="WRITE",
            permission="ALLOW",
        )
        for i in range(args.acls)
    ]
    authorizer = Authorizer(["User:admin"])
    samples = []
    for i in range(200):
        start = time.perf_counter()
        authorizer.authorize(acls, "User:u7", "127.0.0.1", "WRITE", "TOPIC", f"topic-{i}")
        samples.append(time.perf_counter() - start)
    results[f"one ACL decision, {args.acls} ACLs (ms)"] = _ms(samples)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
