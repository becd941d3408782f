"""A local cluster on disk: its config, its processes and their PID files.

Layout of a cluster directory:

    cluster.json          the cluster's config (ports, secrets; mode 0600)
    quorum.json           what controllers read (mode 0600)
    controller-N/         a controller's Raft journal and snapshot
    broker-N/             a broker's config and data (WAL)
    s3/                   the embedded object store's data
    logs/<name>.log       one log per process
    pids/<name>.pid       "pid start_time" of each running process
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from controlplane.config import BucketConfig, ControllerAddress, QuorumConfig
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import (
    SeaweedConfig,
    find_free_ports,
    port_in_use,
    start_seaweed,
    stop_process,
    wait_seaweed_ready,
)

DEFAULT_CLUSTER_DIR = Path.home() / ".automqctl" / "cluster"
STOP_TIMEOUT_S = 15.0


class ClusterError(RuntimeError):
    """An operator-facing error: printed as a message, never as a traceback."""


class BrokerSpec(BaseModel):
    node_id: int
    az: str
    kafka_port: int
    metrics_port: int | None = None  # Prometheus /metrics of the broker


class ClusterConfig(BaseModel):
    """Everything needed to (re)start a local cluster; persisted in cluster.json."""

    version: int = 1
    host: str = "127.0.0.1"
    controllers: list[ControllerAddress]
    brokers: list[BrokerSpec]
    password: str
    settings: ControllerSettings = Field(default_factory=ControllerSettings)
    embedded_s3: dict | None = None  # SeaweedConfig JSON when the store is embedded
    buckets: list[BucketConfig] = Field(default_factory=list)
    # broker storage knobs; None: the broker's default (BrokerConfig)
    broker_wal_capacity_bytes: int | None = Field(default=None, ge=16 * 1024 * 1024)
    broker_upload_interval_s: float | None = Field(default=None, gt=0, le=3600)

    def quorum_config(self) -> QuorumConfig:
        return QuorumConfig(controllers=self.controllers, password=self.password,
                            settings=self.settings, buckets=self.buckets)

    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.host}:{b.kafka_port}" for b in self.brokers)

    def all_ports(self) -> dict[str, int]:
        ports = {}
        for c in self.controllers:
            ports[f"controller-{c.node_id} raft"] = c.raft_port
            ports[f"controller-{c.node_id} api"] = c.api_port
        for b in self.brokers:
            ports[f"broker-{b.node_id} kafka"] = b.kafka_port
            if b.metrics_port:
                ports[f"broker-{b.node_id} metrics"] = b.metrics_port
        if self.embedded_s3:
            for name, port in self.embedded_s3["ports"].items():
                ports[f"s3 {name}"] = port
        return ports


def redact_uri(uri: str) -> str:
    """A bucket URI without credentials in its query string."""
    if "?" not in uri:
        return uri
    base, query = uri.split("?", 1)
    kept = [p for p in query.split("&")
            if p.split("=", 1)[0].lower() not in ("accesskey", "secretkey", "access_key",
                                                   "secret_key", "sessiontoken")]
    return base + ("?" + "&".join(kept) if kept else "")


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return fields[19]  # field 22 of stat: start time in clock ticks since boot


class LocalCluster:
    """Creates, starts, inspects and stops the processes of one cluster directory."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).expanduser().resolve()

    # ------------------------------------------------------------ paths and config

    @property
    def config_path(self) -> Path:
        return self.dir / "cluster.json"

    def exists(self) -> bool:
        return self.config_path.exists()

    def load(self) -> ClusterConfig:
        if not self.exists():
            raise ClusterError(f"no cluster in {self.dir} (run `automqctl cluster up`)")
        try:
            return ClusterConfig.model_validate_json(self.config_path.read_text())
        except ValueError as exc:
            raise ClusterError(f"{self.config_path} is not a valid cluster config: {exc}") from None

    def log_path(self, name: str) -> Path:
        return self.dir / "logs" / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        return self.dir / "pids" / f"{name}.pid"

    def component_names(self, config: ClusterConfig) -> list[str]:
        names = ["s3"] if config.embedded_s3 else []
        names += [f"controller-{c.node_id}" for c in config.controllers]
        names += [f"broker-{b.node_id}" for b in config.brokers]
        return names

    def create(self, brokers: int, controllers: int, azs: list[str], base_port: int | None,
               bucket_uris: str | None, session_timeout_ms: int,
               wal_capacity_bytes: int | None = None,
               upload_interval_s: float | None = None) -> ClusterConfig:
        """Write a new cluster config with fresh ports and secrets."""
        if brokers < 1 or controllers < 1:
            raise ClusterError("a cluster needs at least one broker and one controller")
        if controllers % 2 == 0:
            raise ClusterError(f"{controllers} controllers cannot form a safe majority; use an odd count")
        if not azs:
            raise ClusterError("at least one AZ name is needed")
        needed = controllers * 2 + brokers * 2 + (0 if bucket_uris else 10)
        if base_port is not None:
            if not 1024 <= base_port <= 65535 - needed:
                raise ClusterError(f"--base-port must be in 1024..{65535 - needed}")
            ports = list(range(base_port, base_port + needed))
        else:
            ports = find_free_ports(needed)
        host = "127.0.0.1"
        ctrl = [ControllerAddress(node_id=i, host=host, raft_port=ports[2 * i],
                                  api_port=ports[2 * i + 1]) for i in range(controllers)]
        off = controllers * 2
        brk = [BrokerSpec(node_id=i + 1, az=azs[i % len(azs)], kafka_port=ports[off + 2 * i],
                          metrics_port=ports[off + 2 * i + 1])
               for i in range(brokers)]
        off += brokers * 2
        embedded: dict | None = None
        if bucket_uris:
            buckets = _external_buckets(bucket_uris)
        else:
            s3 = SeaweedConfig.generate(self.dir / "s3")
            s3.ports = dict(zip(s3.ports, ports[off:off + 10]))
            embedded = s3.to_json()
            buckets = [
                BucketConfig(bucket_id=i, uri=f"{i}@s3://{name}?region=us-east-1&endpoint={s3.endpoint}",
                             access_key=s3.access_key, secret_key=s3.secret_key)
                for i, name in enumerate(s3.buckets)
            ]
        settings = ControllerSettings(bucket_ids=[b.bucket_id for b in buckets],
                                      broker_session_timeout_ms=session_timeout_ms)
        config = ClusterConfig(host=host, controllers=ctrl, brokers=brk,
                               password=secrets.token_urlsafe(24), settings=settings,
                               embedded_s3=embedded, buckets=buckets,
                               broker_wal_capacity_bytes=wal_capacity_bytes,
                               broker_upload_interval_s=upload_interval_s)
        self.save(config)
        return config

    def save(self, config: ClusterConfig) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_private(self.config_path, config.model_dump_json(indent=2))

    # ------------------------------------------------------------ processes

    def running(self, name: str) -> int | None:
        """PID of component `name` if it is running (and is the process we started)."""
        path = self.pid_path(name)
        try:
            pid_text, start = path.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return pid if _proc_start_time(pid) == start else None

    def running_pids(self, config: ClusterConfig) -> dict[str, int]:
        return {n: pid for n in self.component_names(config) if (pid := self.running(n))}

    def _spawn(self, name: str, argv: list[str], cwd: Path | None = None) -> int:
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=str(cwd or self.dir), env=env)
        self._record_pid(name, proc.pid)
        return proc.pid

    def _record_pid(self, name: str, pid: int) -> None:
        start = None
        for _ in range(50):  # /proc entry appears right after fork
            start = _proc_start_time(pid)
            if start:
                break
            time.sleep(0.01)
        path = self.pid_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{pid} {start or 0}\n")

    def check_ports(self, config: ClusterConfig) -> None:
        busy = [f"{what} ({port})" for what, port in config.all_ports().items()
                if port_in_use(port, config.host)]
        if busy:
            raise ClusterError("ports already in use: " + ", ".join(busy)
                               + ". Stop whatever holds them, or create the cluster with "
                               "another --base-port / --dir")

    def start_object_store(self, config: ClusterConfig, timeout_s: float = 60.0) -> None:
        if not config.embedded_s3:
            return
        s3 = SeaweedConfig.from_json(config.embedded_s3)
        proc = start_seaweed(s3, self.log_path("s3"))
        self._record_pid("s3", proc.pid)
        wait_seaweed_ready(s3, timeout_s, proc)

    def start_controller(self, config: ClusterConfig, node_id: int) -> int:
        qpath = self.dir / "quorum.json"
        _write_private(qpath, config.quorum_config().model_dump_json(indent=2))
        return self._spawn(f"controller-{node_id}", [
            sys.executable, "-m", "controlplane.server", "--config", str(qpath),
            "--node-id", str(node_id), "--data-dir", str(self.dir / f"controller-{node_id}")])

    def start_broker(self, config: ClusterConfig, node_id: int) -> int:
        from dataplane.node import BrokerConfig  # the broker's own config model

        spec = next((b for b in config.brokers if b.node_id == node_id), None)
        if spec is None:
            raise ClusterError(f"broker {node_id} is not part of this cluster")
        bdir = self.dir / f"broker-{node_id}"
        storage: dict = {}
        if config.broker_wal_capacity_bytes is not None:
            storage["wal_capacity_bytes"] = config.broker_wal_capacity_bytes
        if config.broker_upload_interval_s is not None:
            storage["upload_interval_s"] = config.broker_upload_interval_s
        bcfg = BrokerConfig(node_id=node_id, az=spec.az, host=config.host,
                            kafka_port=spec.kafka_port, data_dir=bdir,
                            controllers=config.quorum_config().api_addresses(),
                            bucket_uris=",".join(b.uri_with_credentials() for b in config.buckets),
                            metrics_port=spec.metrics_port or 0, **storage)
        _write_private(bdir / "broker.json", bcfg.model_dump_json(indent=2))
        return self._spawn(f"broker-{node_id}", [
            sys.executable, "-m", "dataplane.node", "--config", str(bdir / "broker.json")])

    def stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S, kill: bool = False) -> bool:
        """Stop one component (SIGTERM, SIGKILL after the timeout). True if it was running."""
        pid = self.running(name)
        if pid is None:
            self.pid_path(name).unlink(missing_ok=True)
            return False
        stop_process(pid, timeout_s=0.0 if kill else timeout_s)
        self.pid_path(name).unlink(missing_ok=True)
        return True

    def stop_all(self, config: ClusterConfig) -> list[str]:
        """Stop brokers, then controllers, then the object store; names that were running."""
        stopped = []
        order = [n for n in self.component_names(config) if n.startswith("broker-")]
        order += [n for n in self.component_names(config) if n.startswith("controller-")]
        order += [n for n in self.component_names(config) if n == "s3"]
        for name in order:
            if self.stop(name):
                stopped.append(name)
        return stopped

    def purge(self) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir)


def _external_buckets(bucket_uris: str) -> list[BucketConfig]:
    """Bucket configs from `0@s3://b?region=..&endpoint=..,1@s3://...`; credentials come
    from the URI (accessKey/secretKey) or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY."""
    buckets: list[BucketConfig] = []
    for part in [p.strip() for p in bucket_uris.split(",") if p.strip()]:
        if "@" not in part:
            raise ClusterError(f"bucket URI {part!r} needs an id: ID@s3://bucket?...")
        id_text, uri = part.split("@", 1)
        if not id_text.isdigit() or not uri.startswith("s3://"):
            raise ClusterError(f"bucket URI {part!r} must look like 0@s3://bucket?region=..")
        query = dict(q.split("=", 1) for q in uri.split("?", 1)[1].split("&") if "=" in q) \
            if "?" in uri else {}
        buckets.append(BucketConfig(
            bucket_id=int(id_text), uri=f"{id_text}@{redact_uri(uri)}",
            access_key=query.get("accessKey", os.environ.get("AWS_ACCESS_KEY_ID", "")),
            secret_key=query.get("secretKey", os.environ.get("AWS_SECRET_ACCESS_KEY", ""))))
    ids = [b.bucket_id for b in buckets]
    if not buckets or len(set(ids)) != len(ids):
        raise ClusterError("bucket URIs need distinct ids, e.g. 0@s3://main?..,1@s3://failover?..")
    return buckets


def check_bucket_reachable(bucket: BucketConfig, timeout_s: float = 5.0) -> None:
    """head_bucket with short timeouts: a clear error instead of a hang or a traceback."""
    import boto3
    from botocore.config import Config

    uri = bucket.uri.split("@", 1)[1]
    name = uri[len("s3://"):].split("?", 1)[0]
    query = dict(q.split("=", 1) for q in uri.split("?", 1)[1].split("&") if "=" in q) \
        if "?" in uri else {}
    client = boto3.client(
        "s3", endpoint_url=query.get("endpoint"), region_name=query.get("region", "us-east-1"),
        aws_access_key_id=bucket.access_key or None,
        aws_secret_access_key=bucket.secret_key or None,
        config=Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                      retries={"max_attempts": 1}, s3={"addressing_style": "path"}))
    try:
        client.head_bucket(Bucket=name)
    except Exception as exc:
        raise ClusterError(f"bucket {bucket.bucket_id} ({redact_uri(uri)}) is not reachable: "
                           f"{exc}") from None
