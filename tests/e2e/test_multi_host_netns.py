"""Three simulated hosts (network namespaces on a bridge, tests/e2e/netns_hosts.py), each
running one controller and one broker from `cluster init` + `node run --allow-insecure`, the
object store (a real SeaweedFS) on the bridge. With an idempotent producer's acked-write
ledger running, one host at a time:
- the controller leader's host is partitioned for 30 s: a new leader is elected, no healthy
  broker is fenced, produce to the healthy brokers' partitions keeps acking (longest gap
  within the session timeout + 2 s);
- a broker host is partitioned: it fences itself (closes its client connections, refuses
  new ones) and its partitions ack on other brokers within 10 s;
- a host crashes (kill -9 of its controller and broker);
each healed afterwards, and every acknowledged record is read back exactly once. The
figures (election time, longest produce gap, time until the isolated broker's partitions
ack elsewhere) are printed and kept in docs/operations.md.

The cluster is set up once for the three cases (about a minute); each case uses its own
topic and ledger. Skipped, with the reason, where network namespaces cannot be made."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError
from dataplane.objectstore.seaweed import (
    SeaweedConfig,
    start_seaweed,
    stop_process,
    wait_seaweed_ready,
)
from tests.e2e.netns_hosts import SimulatedHosts, namespaces_unavailable
from tests.support.cluster import create_topic, leaders
from tests.support.ledger import AckLedger

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SESSION_MS = 6_000
RAFT_PORT, API_PORT, KAFKA_PORT, SHARD_STORE_PORT = 9093, 9094, 9092, 9095
PARTITIONS = 6
RATE_PER_PARTITION = 20


@dataclasses.dataclass
class Cluster:
    """The running 3-host cluster (one test thread drives it)."""

    hosts: SimulatedHosts
    out: Path
    logs: Path
    env: dict[str, str]
    bootstrap: str
    api_secret: str
    procs: dict[str, list[subprocess.Popen]] = dataclasses.field(default_factory=dict)

    @property
    def controller_addresses(self) -> list[str]:
        return [f"{h}:{API_PORT}" for h in self.hosts.hosts]

    def start_host(self, host: str) -> None:
        """`node run` every node of `host` (a restart appends to the same logs)."""
        self.procs[host] = [
            self.hosts.run(
                host,
                [
                    sys.executable,
                    "-m",
                    "cli.main",
                    "node",
                    "run",
                    "--config",
                    str(node_file),
                    "--allow-insecure",
                ],
                self.logs / f"{host}-{node_file.stem}.log",
                self.env,
            )
            for node_file in sorted((self.out / host).glob("*-*.json"))
        ]

    def kill_host(self, host: str) -> None:
        for proc in self.procs.pop(host, []):
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def broker_log(self, host: str) -> str:
        broker_id = self.hosts.hosts.index(host) + 1
        return (self.logs / f"{host}-broker-{broker_id}.log").read_text(errors="replace")

    def views(self, timeout_s: float = 1.0, exclude: str | None = None) -> dict[str, dict | None]:
        """Each controller's /v1/status (None: unreachable), but those on host `exclude`."""
        client = ControllerClient(
            self.controller_addresses, request_timeout_s=timeout_s, api_secret=self.api_secret
        )
        out: dict[str, dict | None] = {}
        for address in self.controller_addresses:
            if exclude and address.startswith(exclude + ":"):
                continue
            try:
                out[address] = client.status(address)
            except (ControllerError, OSError):
                out[address] = None
        return out

    def leader_view(self, exclude: str | None = None) -> dict | None:
        """The status of the leader with the highest term (not on host `exclude`)."""
        best = None
        for view in self.views(exclude=exclude).values():
            if view is None:
                continue
            raft = view["raft"]
            if raft["state"] == "leader" and (best is None or raft["term"] > best["raft"]["term"]):
                best = view
        return best

    def status(self) -> dict:
        """`automqctl cluster status --controllers ...` (JSON), as an operator runs it."""
        res = subprocess.run(
            [sys.executable, "-m", "cli.main", "cluster", "status", "--format", "json",
             "--controllers", ",".join(self.controller_addresses)],
            capture_output=True, text=True, timeout=60,
            env={**self.env, "AUTOMQ_CONTROLLER_SECRET": self.api_secret},
        )  # fmt: skip
        assert res.stdout, res.stderr
        return json.loads(res.stdout)


def wait_for(what: str, check: Callable[[], object], timeout_s: float, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def brokers_unfenced(cluster: Cluster) -> dict[int, int] | None:
    """node id -> epoch when all three brokers are registered and unfenced, else None."""
    view = cluster.leader_view()
    brokers = {b["node_id"]: b for b in (view or {}).get("brokers", [])}
    if len(brokers) == 3 and not any(b["fenced"] for b in brokers.values()):
        return {n: b["node_epoch"] for n, b in brokers.items()}
    return None


def topology(hosts: SimulatedHosts, endpoint: str, root: Path) -> dict:
    return {
        "buckets": [f"0@s3://automq-main?region=us-east-1&endpoint={endpoint}"],
        "controllers": [
            {
                "id": i,
                "host": h,
                "raft_port": RAFT_PORT,
                "api_port": API_PORT,
                "data_dir": str(root / h / "controller-{id}"),
            }
            for i, h in enumerate(hosts.hosts)
        ],
        "brokers": [
            {
                "id": i + 1,
                "host": h,
                "az": f"az{i + 1}",
                "kafka_port": KAFKA_PORT,
                "shard_store_port": SHARD_STORE_PORT,
                "data_dir": str(root / h / "broker-{id}"),
                "wal_capacity_mib": 64,
            }
            for i, h in enumerate(hosts.hosts)
        ],
        "broker_session_timeout_ms": SESSION_MS,
        "upload_interval_s": 2,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    why = namespaces_unavailable()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("netns")
    c: Cluster | None = None
    with SimulatedHosts(3) as hosts:
        store = dataclasses.replace(SeaweedConfig.generate(root / "seaweed"), host=hosts.gateway)
        weed = start_seaweed(store, root / "weed.log")
        try:
            wait_seaweed_ready(store, proc=weed)
            topo_file = root / "topo.yaml"
            topo_file.write_text(yaml.safe_dump(topology(hosts, store.endpoint, root / "data")))
            out = root / "out"
            res = subprocess.run(
                [sys.executable, "-m", "cli.main", "cluster", "init", "--topology",
                 str(topo_file), "--out", str(out), "--format", "json"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert res.returncode == 0, res.stderr
            init = json.loads(res.stdout)
            secrets = json.loads((out / hosts.hosts[0] / "secrets.json").read_text())
            (root / "logs").mkdir()
            c = Cluster(
                hosts=hosts,
                out=out,
                logs=root / "logs",
                env={
                    **os.environ,
                    "AUTOMQ_S3_ACCESS_KEY_0": store.access_key,
                    "AUTOMQ_S3_SECRET_KEY_0": store.secret_key,
                },
                bootstrap=init["bootstrap_servers"],
                api_secret=secrets["api_secret"],
            )
            for host in hosts.hosts:
                c.start_host(host)
            try:
                wait_for("3 brokers unfenced", lambda: brokers_unfenced(c), 120, 1.0)
            except AssertionError as exc:
                tails = {f.name: f.read_text(errors="replace")[-2000:] for f in c.logs.iterdir()}
                raise AssertionError(f"{exc}; the nodes' logs end with: {tails}") from None
            yield c
        finally:
            for procs in c.procs.values() if c is not None else []:
                for proc in procs:
                    if proc.poll() is None:
                        proc.terminate()
            hosts.close()
            stop_process(weed)


def start_ledger(cluster: Cluster, topic: str) -> AckLedger:
    create_topic(cluster.bootstrap, topic, PARTITIONS, timeout_s=60)
    ledger = AckLedger(cluster.bootstrap, topic, PARTITIONS, rate_per_partition=RATE_PER_PARTITION)
    ledger.start()
    ledger.wait_writable(set(range(PARTITIONS)), time.monotonic(), timeout_s=60)
    return ledger


def finish_ledger(ledger: AckLedger) -> None:
    ledger.stop()
    report = ledger.verify()
    assert report.acked > 500 and report.ok, report
    assert ledger.failed == 0, ledger.errors


def host_of_broker(cluster: Cluster, broker_id: int) -> str:
    return cluster.hosts.hosts[broker_id - 1]


def test_controller_leader_host_partitioned_30s(cluster: Cluster):
    epochs = wait_for("3 brokers unfenced", lambda: brokers_unfenced(cluster), 120, 1.0)
    old = wait_for("a controller leader", cluster.leader_view, 30)
    lost_host = old["api_address"].rsplit(":", 1)[0]
    lost_broker = cluster.hosts.hosts.index(lost_host) + 1
    status = cluster.status()
    assert status["state"] == "healthy" and status["leader"] == old["node_id"], status
    assert [c["reachable"] for c in status["controllers"]] == [True] * 3
    assert sorted(b["node_id"] for b in status["brokers"]) == [1, 2, 3]
    ledger = start_ledger(cluster, "leader-host")
    led = leaders(cluster.bootstrap, "leader-host")
    healthy = {p for p, b in led.items() if b != lost_broker}
    isolated = {p for p, b in led.items() if b == lost_broker}
    time.sleep(3)  # a steady stream before the fault
    cut_at = time.monotonic()
    cluster.hosts.partition(lost_host)
    healed = False
    try:
        new = wait_for(
            "a new controller leader",
            lambda: (
                (v := cluster.leader_view(exclude=lost_host))
                and v["raft"]["term"] > old["raft"]["term"]
                and v
            ),
            20,
            0.1,
        )
        election_s = time.monotonic() - cut_at
        status = cluster.status()  # the quorum as an operator sees it now
        lost_address = f"{lost_host}:{API_PORT}"
        assert status["leader"] == new["node_id"], status
        assert [c["address"] for c in status["controllers"] if not c["reachable"]] == [
            lost_address
        ], status
        healthy_fenced: set[int] = set()
        while time.monotonic() - cut_at < 30:  # the whole 30 s: no healthy broker fenced
            view = cluster.leader_view(exclude=lost_host) or {}
            for b in view.get("brokers", []):
                if b["node_id"] != lost_broker and (
                    b["fenced"] or b["node_epoch"] != epochs[b["node_id"]]
                ):
                    healthy_fenced.add(b["node_id"])
            time.sleep(0.5)
        gaps = ledger.unavailability_s(healthy, cut_at)
        moved = ledger.writable_again_s(isolated, cut_at)
        cluster.hosts.heal(lost_host)
        healed = True
        heal_at = time.monotonic()
        print(
            f"\ncontroller leader host {lost_host} partitioned 30 s: new leader "
            f"{new['node_id']} after {election_s:.2f} s; longest produce gap of the healthy "
            f"brokers' partitions {max(gaps.values()):.2f} s ({gaps}); the isolated broker "
            f"{lost_broker}'s partitions acked elsewhere after {moved}"
        )
        assert not healthy_fenced, f"healthy brokers fenced: {healthy_fenced}"
        assert max(gaps.values()) <= SESSION_MS / 1000 + 2, gaps
        ledger.wait_writable(set(range(PARTITIONS)), heal_at, timeout_s=60)
        wait_for("the isolated broker back", lambda: brokers_unfenced(cluster), 90, 1.0)
    finally:
        if not healed:
            cluster.hosts.heal(lost_host)
    finish_ledger(ledger)


def test_broker_host_partitioned(cluster: Cluster):
    wait_for("3 brokers unfenced", lambda: brokers_unfenced(cluster), 120, 1.0)
    leader = wait_for("a controller leader", cluster.leader_view, 30)
    leader_host = leader["api_address"].rsplit(":", 1)[0]
    ledger = start_ledger(cluster, "broker-host")
    led = leaders(cluster.bootstrap, "broker-host")
    # a host whose controller follows (its loss needs no election) and whose broker leads
    lost_broker = next(
        b for b in sorted(set(led.values())) if host_of_broker(cluster, b) != leader_host
    )
    lost_host = host_of_broker(cluster, lost_broker)
    isolated = {p for p, b in led.items() if b == lost_broker}
    log_before = len(cluster.broker_log(lost_host))
    time.sleep(3)
    cut_wall = time.time()
    cut_at = time.monotonic()
    cluster.hosts.partition(lost_host)
    try:
        moved = ledger.wait_writable(isolated, cut_at, timeout_s=30)
        wait_for(
            "the isolated broker to fence itself",
            lambda: "fences itself" in cluster.broker_log(lost_host)[log_before:],
            SESSION_MS / 1000 + 10,
        )
        fenced_line = next(
            line
            for line in cluster.broker_log(lost_host)[log_before:].splitlines()
            if "fences itself" in line
        )
        fenced_itself_s = (
            time.mktime(time.strptime(fenced_line[:19], "%Y-%m-%d %H:%M:%S"))
            + int(fenced_line[20:23]) / 1000
            - cut_wall
        )
        closed = [
            line
            for line in cluster.broker_log(lost_host)[log_before:].splitlines()
            if "client connections: no controller answered" in line
        ]
        # a new connection from its own host is refused (closed before an answer)
        probe = cluster.hosts.exec(
            lost_host,
            [sys.executable, "-c", PROBE, lost_host, str(KAFKA_PORT)],
            timeout_s=30,
        )
    finally:
        cluster.hosts.heal(lost_host)
    heal_at = time.monotonic()
    print(
        f"\nbroker host {lost_host} partitioned: its partitions {sorted(isolated)} acked on "
        f"other brokers after {moved}; it fenced itself {fenced_itself_s:.1f} s after the cut "
        f"({closed[:1]}); a new connection from its host: {probe.stdout.strip()}"
    )
    assert max(moved.values()) <= 10, moved
    assert fenced_itself_s <= SESSION_MS / 1000 + 2, fenced_itself_s
    assert closed, "the isolated broker did not close its client connections"
    assert probe.stdout.strip() == "closed", (probe.stdout, probe.stderr)
    ledger.wait_writable(set(range(PARTITIONS)), heal_at, timeout_s=60)
    wait_for("the isolated broker back", lambda: brokers_unfenced(cluster), 90, 1.0)
    finish_ledger(ledger)


def test_host_crash(cluster: Cluster):
    wait_for("3 brokers unfenced", lambda: brokers_unfenced(cluster), 120, 1.0)
    leader = wait_for("a controller leader", cluster.leader_view, 30)
    lost_host = leader["api_address"].rsplit(":", 1)[0]  # the worst host to lose
    ledger = start_ledger(cluster, "host-crash")
    time.sleep(3)
    killed_at = time.monotonic()
    cluster.kill_host(lost_host)
    again = ledger.wait_writable(set(range(PARTITIONS)), killed_at, timeout_s=60)
    gaps = ledger.unavailability_s(set(range(PARTITIONS)), killed_at)
    print(
        f"\nhost {lost_host} (controller leader and a broker) killed: every partition acked "
        f"again after {max(again.values()):.2f} s; longest gap {max(gaps.values()):.2f} s"
    )
    cluster.start_host(lost_host)
    wait_for("the crashed host's broker back", lambda: brokers_unfenced(cluster), 120, 1.0)
    finish_ledger(ledger)


# connects to a broker and sends an ApiVersions request: "closed" if the connection is closed
# (or reset, or refused) before an answer, "answered" if an answer comes
PROBE = """
import socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
body = struct.pack(">hhih", 18, 0, 1, 5) + b"probe"
try:
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(struct.pack(">i", len(body)) + body)
    s.settimeout(5)
    print("answered" if s.recv(4) else "closed")
except (ConnectionError, socket.timeout) as exc:
    print("closed" if not isinstance(exc, socket.timeout) else "timeout")
"""
