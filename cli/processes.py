"""A local cluster on disk: its config, its processes and their PID files.

Layout of a cluster directory:

    cluster.json          the cluster's config (ports, secrets; mode 0600)
    quorum.json           what controllers read (mode 0600)
    controller-api.secret the controller API's bearer secret (mode 0600; controlplane/auth.py)
    admin.credentials     with --sasl: the admin (super) user's SASL login, JSON (mode 0600)
    controller-N/         a controller's Raft journal and snapshot
    broker-N/             a broker's config and data (WAL)
    s3/                   the embedded object store's data (or STORE_DIR/s3 with
                          `cluster up --store-dir STORE_DIR`; s3-failover/ likewise)
    logs/<name>.log       one log per process
    pids/<name>.pid       "pid start_time" of each running process

A PID file is only trusted while its PID is alive and has the recorded start time (the same
process, not a reused PID). A process of the cluster without a true PID file (started by
hand, or whose file went stale) is still found: its command line points at this directory's
config (`controlplane.server --config DIR/quorum.json --node-id N`,
`dataplane.node --config DIR/broker-N/broker.json`, `weed mini -dir=DIR/s3/data`), which
/proc shows.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from controlplane.auth import SECRET_FILE_NAME, generate_secret
from controlplane.config import BucketConfig, ControllerAddress, QuorumConfig
from controlplane.listeners import (
    SASL_PROTOCOLS,
    TLS_PROTOCOLS,
    ListenerSpecError,
    parse_listener_kinds,
)
from controlplane.records import BrokerEndpoint
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import (
    ADMIN_GRPC_OFFSET,
    SeaweedConfig,
    find_admin_ports,
    find_free_ports,
    port_in_use,
    start_seaweed,
    wait_seaweed_ready,
)

ADMIN_USER = "admin"
ADMIN_CREDENTIALS_FILE = "admin.credentials"
# the brokers' own super user on a --sasl cluster (inter-broker requests: WriteTxnMarkers);
# its login is copied into each broker's 0600 config, not shared with the operator's
BROKER_USER = "broker"
BROKER_CREDENTIALS_FILE = "broker.credentials"
DEFAULT_CLUSTER_DIR = Path.home() / ".automqctl" / "cluster"
STOP_TIMEOUT_S = 15.0
# after SIGKILL: a process killed in the middle of an fsync can take seconds to go
KILL_WAIT_S = 30.0
_POLL_S = 0.02


FAILOVER_STORE = "s3-failover"  # the component name of the failover bucket's store
STORE_COMPONENTS = ("s3", FAILOVER_STORE)
COMPACTION_SCHEDULER = "compaction-scheduler"  # component name (cli/compaction_scheduler.py)


class ClusterError(RuntimeError):
    """An operator-facing error: printed as a message, never as a traceback."""


class BrokerSpec(BaseModel):
    node_id: int
    az: str
    kafka_port: int  # its first listener's
    metrics_port: int | None = None  # Prometheus /metrics of the broker
    # the port of each listener (ClusterConfig.listeners order; the first is kafka_port);
    # None: one listener on kafka_port
    listener_ports: list[int] | None = None


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class ListenerKind(BaseModel):
    """One listener every broker of a local cluster serves (`cluster up --listeners`)."""

    name: str
    security_protocol: SecurityProtocol


class ClusterConfig(BaseModel):
    """Everything needed to (re)start a local cluster; persisted in cluster.json."""

    version: int = 1
    host: str = "127.0.0.1"
    controllers: list[ControllerAddress]
    brokers: list[BrokerSpec]
    password: str
    # the controller API's bearer secret; None only in configs written before it existed
    # (`cluster up` then adds one: LocalCluster.ensure_api_secret)
    api_secret: str | None = None
    settings: ControllerSettings = Field(default_factory=ControllerSettings)
    embedded_s3: dict | None = None  # SeaweedConfig JSON when the store is embedded
    # the second embedded store (component "s3-failover", bucket 1): a separate process
    # with its own data dir, so the main store can fail alone. None in configs written
    # before it existed (their one store holds both buckets)
    embedded_s3_failover: dict | None = None
    # `cluster up --store-dir`: the directory (absolute) holding the embedded stores' data
    # (its s3/ and s3-failover/) instead of the cluster directory, e.g. on another device
    # than the brokers' WALs. None: the cluster directory
    store_dir: str | None = None
    buckets: list[BucketConfig] = Field(default_factory=list)
    # broker storage knobs; None: the broker's default (BrokerConfig)
    broker_wal_capacity_bytes: int | None = Field(default=None, ge=16 * 1024 * 1024)
    broker_upload_interval_s: float | None = Field(default=None, gt=0, le=3600)
    broker_retention_check_interval_s: float | None = Field(default=None, gt=0, le=86400)
    # where brokers keep their WAL: a local file, or objects in the main bucket (s3)
    broker_wal: Literal["file", "s3"] = "file"
    # the flags of `cluster up` that made this config (None in configs written before)
    azs: list[str] | None = None
    base_port: int | None = None
    # the Kafka listeners: SASL with ACLs (`cluster up --sasl`), TLS (`--tls`, certificates
    # in DIR/tls/): SASL_SSL, SASL_PLAINTEXT, SSL or PLAINTEXT
    sasl: bool = False
    tls: bool = False
    # with --tls the controller API is HTTPS too, with the same CA (None in configs written
    # before: their controller API stays HTTP)
    tls_dir: str | None = None
    # several listeners per broker (`--listeners PLAINTEXT,SASL_SSL`); None: one whose
    # protocol follows --sasl / --tls
    listeners: list[ListenerKind] | None = None
    # `--mtls`: SSL listeners require a client certificate of the cluster CA (its CN is the
    # principal); the CLI uses DIR/tls/admin.pem (CN admin), brokers DIR/tls/broker.pem
    mtls: bool = False

    def listener_kinds(self) -> list[ListenerKind]:
        """Every broker's listeners, in order (the legacy single one when not set)."""
        if self.listeners:
            return list(self.listeners)
        protocol = ("SASL_" if self.sasl else "") + ("SSL" if self.tls else "PLAINTEXT")
        return [ListenerKind(name=protocol, security_protocol=protocol)]

    def client_listener_index(self) -> int:
        """The listener the CLI's clients and the brokers themselves use: the first SASL one
        on a --sasl cluster (the admin and broker logins need it), else the first SSL one
        with --mtls (their client certificates), else the first."""
        kinds = self.listener_kinds()
        wanted = SASL_PROTOCOLS if self.sasl else {"SSL"} if self.mtls else None
        for i, kind in enumerate(kinds):
            if wanted is not None and kind.security_protocol in wanted:
                return i
        return 0

    def broker_endpoints(self, spec: BrokerSpec) -> list[BrokerEndpoint]:
        """The endpoints of one broker, in listener order."""
        ports = spec.listener_ports or [spec.kafka_port]
        return [
            BrokerEndpoint(
                name=k.name, host=self.host, port=port, security_protocol=k.security_protocol
            )
            for k, port in zip(self.listener_kinds(), ports, strict=True)
        ]

    @property
    def controller_ca_file(self) -> str | None:
        """The CA clients verify the HTTPS controller API with (None: plain HTTP)."""
        return str(Path(self.tls_dir) / "ca.pem") if self.tls_dir else None

    @property
    def security_protocol(self) -> str:
        """The protocol of the listener the CLI's clients use."""
        return self.listener_kinds()[self.client_listener_index()].security_protocol

    def quorum_config(self) -> QuorumConfig:
        tls = (
            {
                "tls_cert_file": str(Path(self.tls_dir) / "server.pem"),
                "tls_key_file": str(Path(self.tls_dir) / "server.key"),
            }
            if self.tls_dir
            else {}
        )
        return QuorumConfig(
            controllers=self.controllers,
            password=self.password,
            api_secret=self.api_secret,
            settings=self.settings,
            buckets=self.buckets,
            **tls,
        )

    def bootstrap_servers(self, listener: str | None = None) -> str:
        """host:port of every broker on `listener` (default: the CLI's listener)."""
        names = [k.name for k in self.listener_kinds()]
        index = names.index(listener) if listener is not None else self.client_listener_index()
        return ",".join(
            f"{self.host}:{(b.listener_ports or [b.kafka_port])[index]}" for b in self.brokers
        )

    def bootstrap_servers_of(self, spec: BrokerSpec) -> str:
        """host:port of one broker on the CLI's listener."""
        ports = spec.listener_ports or [spec.kafka_port]
        return f"{self.host}:{ports[self.client_listener_index()]}"

    def all_ports(self) -> dict[str, int]:
        ports = {}
        for c in self.controllers:
            ports[f"controller-{c.node_id} raft"] = c.raft_port
            ports[f"controller-{c.node_id} api"] = c.api_port
        for b in self.brokers:
            if b.listener_ports and len(b.listener_ports) > 1:
                for kind, port in zip(self.listener_kinds(), b.listener_ports, strict=True):
                    ports[f"broker-{b.node_id} kafka {kind.name}"] = port
            else:
                ports[f"broker-{b.node_id} kafka"] = b.kafka_port
            if b.metrics_port:
                ports[f"broker-{b.node_id} metrics"] = b.metrics_port
        for component, store in self.embedded_stores().items():
            for name, port in store["ports"].items():
                ports[f"{component} {name}"] = port
        return ports

    def embedded_stores(self) -> dict[str, dict]:
        """Component name -> SeaweedConfig JSON of every embedded object store."""
        stores = {}
        if self.embedded_s3:
            stores["s3"] = self.embedded_s3
        if self.embedded_s3_failover:
            stores[FAILOVER_STORE] = self.embedded_s3_failover
        return stores

    def object_stores(self, pids: dict[str, int]) -> list[dict]:
        """`cluster status`'s `object_stores`: name, bucket ids, pid, endpoint of each
        embedded store (empty for external buckets)."""
        out = []
        for component, store in self.embedded_stores().items():
            endpoint = SeaweedConfig.from_json(store).endpoint
            out.append(
                {
                    "name": "main" if component == "s3" else "failover",
                    "component": component,
                    "bucket_ids": [b.bucket_id for b in self.buckets if endpoint in b.uri],
                    "pid": pids.get(component),
                    "endpoint": endpoint,
                    # where its data lives (DIR/s3, or under `cluster up --store-dir`)
                    "data_dir": store["data_dir"],
                }
            )
        return out


def redact_uri(uri: str) -> str:
    """A bucket URI without credentials in its query string."""
    if "?" not in uri:
        return uri
    base, query = uri.split("?", 1)
    kept = [
        p
        for p in query.split("&")
        if p.split("=", 1)[0].lower()
        not in ("accesskey", "secretkey", "access_key", "secret_key", "sessiontoken")
    ]
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


def _proc_cmdline(pid: int) -> list[str] | None:
    """argv of a live process, or None (gone, a kernel thread, or not readable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if not raw:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def _proc_cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _option(args: list[str], *names: str) -> str | None:
    """The value of the first of `names` in `args`, as `--name value` or `--name=value`."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1 :]
    return None


def _script_args(argv: list[str], module: str) -> list[str] | None:
    """The arguments after `-m module` (or after its script path), None if argv runs
    something else."""
    script = "/" + module.replace(".", "/") + ".py"
    for i, arg in enumerate(argv):
        if (
            (arg == module and i > 0 and argv[i - 1] == "-m")
            or arg == "-m" + module
            or arg.endswith(script)
        ):
            return argv[i + 1 :]
    return None


def component_of(
    argv: list[str], cwd: str | None, cluster_dir: Path, s3_data_dir: Path | None = None
) -> str | None:
    """The component (`controller-N`, `broker-N`, `s3`) of the cluster in `cluster_dir` that
    the command line `argv` (run in `cwd`) is, or None if it is not one of them."""
    root = os.path.realpath(cluster_dir)

    def resolved(value: str | None) -> str | None:
        if value is None:
            return None
        return os.path.realpath(os.path.join(cwd or "/", value))

    args = _script_args(argv, "controlplane.server")
    if args is not None:
        node_id = _option(args, "--node-id")
        if (
            resolved(_option(args, "--config")) == os.path.join(root, "quorum.json")
            and node_id is not None
            and node_id.strip().isdigit()
        ):
            return f"controller-{int(node_id)}"
        return None
    args = _script_args(argv, "dataplane.node")
    if args is not None:
        config = resolved(_option(args, "--config"))
        m = re.fullmatch(re.escape(root) + r"/broker-(\d+)/broker\.json", config or "")
        return f"broker-{int(m.group(1))}" if m else None
    args = _script_args(argv, "cli.compaction_scheduler")
    if args is not None:
        return COMPACTION_SCHEDULER if resolved(_option(args, "--dir")) == root else None
    if argv and os.path.basename(argv[0]) == "weed" and "mini" in argv[1:]:
        data = resolved(_option(argv[1:], "-dir", "--dir"))
        want = os.path.realpath(s3_data_dir or os.path.join(root, "s3"))
        if data == os.path.join(want, "data"):
            return "s3"
        failover = os.path.join(os.path.dirname(want), FAILOVER_STORE)
        return FAILOVER_STORE if data == os.path.join(failover, "data") else None
    return None


def scan_processes(cluster_dir: Path, s3_data_dir: Path | None = None) -> dict[str, list[int]]:
    """Every live process (zombies excluded) whose command line is a component of the
    cluster in `cluster_dir`, by component name, from /proc."""
    found: dict[str, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        argv = _proc_cmdline(pid)
        # cheap filter first: only our three programs need their cwd and a real match
        if not argv or not any(
            k in a for a in argv for k in ("controlplane", "dataplane", "weed", "compaction")
        ):
            continue
        name = component_of(argv, _proc_cwd(pid), cluster_dir, s3_data_dir)
        if name and _proc_start_time(pid) is not None:
            found.setdefault(name, []).append(pid)
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal the process group when the process leads one (it was started in its own
    session: children go too), otherwise only the process."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(
    pids: list[tuple[int, str | None]], timeout_s: float, kill_wait_s: float = KILL_WAIT_S
) -> list[int]:
    """SIGTERM every (pid, start time) at once, SIGKILL whatever is left after `timeout_s`
    (at once when it is 0), and wait at most `kill_wait_s` more. A start time of None means
    "the process using this PID now". Returns the PIDs still alive."""
    known = [(pid, start or _proc_start_time(pid)) for pid, start in pids]
    # only ever signal the very processes meant: a PID is checked against its start time
    targets = [(pid, start) for pid, start in known if start is not None]

    def alive() -> list[int]:
        return [pid for pid, start in targets if _proc_start_time(pid) == start]

    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_wait_s)):
        if sig == signal.SIGTERM and timeout_s <= 0:
            continue
        for pid in alive():
            _signal(pid, sig)
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if not alive():
            return []
    return alive()


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
        names = list(config.embedded_stores())
        names += [f"controller-{c.node_id}" for c in config.controllers]
        names += [f"broker-{b.node_id}" for b in config.brokers]
        if (self.dir / "compaction" / "schedule.json").exists():
            names.append(COMPACTION_SCHEDULER)  # `compaction schedule` made it a component
        return names

    def start_compaction_scheduler(self) -> int:
        """The process that runs the Spark compaction job on its schedule."""
        return self._spawn(
            COMPACTION_SCHEDULER,
            [sys.executable, "-m", "cli.compaction_scheduler", "--dir", str(self.dir)],
        )

    def create(
        self,
        brokers: int,
        controllers: int,
        azs: list[str],
        base_port: int | None,
        bucket_uris: str | None,
        session_timeout_ms: int,
        wal_capacity_bytes: int | None = None,
        upload_interval_s: float | None = None,
        sasl: bool = False,
        tls: bool = False,
        retention_check_interval_s: float | None = None,
        wal: Literal["file", "s3"] = "file",
        object_delete_delay_s: float | None = None,
        listeners: str | None = None,
        mtls: bool = False,
        bucket_secrets_file: Path | None = None,
        failover_detect_s: float | None = None,
        store_dir: Path | None = None,
    ) -> ClusterConfig:
        """Write a new cluster config with fresh ports and secrets (nothing is written when
        the flags are invalid)."""
        if store_dir is not None:
            if bucket_uris:
                raise ClusterError(
                    "--store-dir holds the embedded object store's data: "
                    "it does not go with --bucket-uris"
                )
            store_dir = check_store_dir(store_dir)
        if bucket_secrets_file is not None and not bucket_uris:
            raise ClusterError(
                "--bucket-secrets-file holds the credentials of external buckets: "
                "it needs --bucket-uris"
            )
        kinds = check_listener_flags(listeners, sasl=sasl, tls=tls)
        if mtls:
            protocols = (
                [k.security_protocol for k in kinds] if kinds else ["SASL_SSL" if sasl else "SSL"]
            )
            if not tls or "SSL" not in protocols:
                raise ClusterError("--mtls needs --tls and an SSL listener (e.g. --listeners SSL)")
        per_broker = len(kinds) if kinds else 1
        if brokers < 1 or controllers < 1:
            raise ClusterError("a cluster needs at least one broker and one controller")
        if controllers % 2 == 0:
            raise ClusterError(
                f"{controllers} controllers cannot form a safe majority; use an odd count"
            )
        if not azs:
            raise ClusterError("at least one AZ name is needed")
        # two embedded stores (main: bucket 0, failover: bucket 1), 10 ports each
        needed = controllers * 2 + brokers * (per_broker + 1) + (0 if bucket_uris else 20)
        # the object store's admin gRPC port is its admin port + ADMIN_GRPC_OFFSET
        top = 65535 - needed - (0 if bucket_uris else ADMIN_GRPC_OFFSET)
        if base_port is not None:
            if not 1024 <= base_port <= top:
                raise ClusterError(f"--base-port must be in 1024..{top}")
            ports = list(range(base_port, base_port + needed))
        else:
            ports = find_free_ports(needed)
        host = "127.0.0.1"
        ctrl = [
            ControllerAddress(
                node_id=i, host=host, raft_port=ports[2 * i], api_port=ports[2 * i + 1]
            )
            for i in range(controllers)
        ]
        off = controllers * 2
        stride = per_broker + 1  # each broker: its listeners' ports, then its metrics port
        brk = [
            BrokerSpec(
                node_id=i + 1,
                az=azs[i % len(azs)],
                kafka_port=ports[off + stride * i],
                metrics_port=ports[off + stride * i + per_broker],
                listener_ports=(
                    ports[off + stride * i : off + stride * i + per_broker] if kinds else None
                ),
            )
            for i in range(brokers)
        ]
        off += brokers * stride
        embedded: dict | None = None
        embedded_failover: dict | None = None
        if bucket_uris:
            buckets = _external_buckets(bucket_uris, bucket_secrets_file)
        else:
            buckets = []
            stores = []
            taken = set(ports)  # chosen for the cluster, not bound yet
            for i, (component, name) in enumerate(
                (("s3", "automq-main"), (FAILOVER_STORE, "automq-failover"))
            ):
                s3 = SeaweedConfig.generate((store_dir or self.dir) / component, buckets=[name])
                s3.ports = dict(zip(s3.ports, ports[off + 10 * i : off + 10 * (i + 1)]))
                if base_port is None:
                    s3.ports["admin"], s3.ports["admin_grpc"] = find_admin_ports(exclude=taken)
                    taken |= {s3.ports["admin"], s3.ports["admin_grpc"]}
                else:
                    s3.ports["admin_grpc"] = s3.ports["admin"] + ADMIN_GRPC_OFFSET
                stores.append(s3.to_json())
                buckets.append(
                    BucketConfig(
                        bucket_id=i,
                        uri=f"{i}@s3://{name}?region=us-east-1&endpoint={s3.endpoint}",
                        access_key=s3.access_key,
                        secret_key=s3.secret_key,
                    )
                )
            embedded, embedded_failover = stores
        settings = ControllerSettings(
            bucket_ids=[b.bucket_id for b in buckets], broker_session_timeout_ms=session_timeout_ms
        )
        if object_delete_delay_s is not None:
            settings.object_destroy_retention_ms = round(object_delete_delay_s * 1000)
        if failover_detect_s is not None:
            settings.bucket_failover_detect_ms = round(failover_detect_s * 1000)
        config = ClusterConfig(
            host=host,
            controllers=ctrl,
            brokers=brk,
            password=secrets.token_urlsafe(24),
            api_secret=generate_secret(),
            settings=settings,
            embedded_s3=embedded,
            embedded_s3_failover=embedded_failover,
            store_dir=str(store_dir) if store_dir is not None else None,
            buckets=buckets,
            broker_wal_capacity_bytes=wal_capacity_bytes,
            broker_upload_interval_s=upload_interval_s,
            broker_retention_check_interval_s=retention_check_interval_s,
            broker_wal=wal,
            azs=list(azs),
            base_port=base_port,
            sasl=sasl,
            tls=tls,
            tls_dir=str(self.tls_dir.resolve()) if tls else None,
            listeners=kinds,
            mtls=mtls,
        )
        if tls:
            from cli.tls import generate_ca_and_server_cert, generate_client_cert

            self.dir.mkdir(parents=True, exist_ok=True)
            generate_ca_and_server_cert(self.tls_dir, ips=[host], dns_names=["localhost"])
            if mtls:
                generate_client_cert(self.tls_dir, ADMIN_USER, "admin")
                generate_client_cert(self.tls_dir, BROKER_USER, "broker")
        self.save(config)
        self.incomplete_path.write_text(
            "the first `cluster up` of this directory has not finished\n"
        )
        return config

    def save(self, config: ClusterConfig) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)  # WAL, journal, logs and secrets: the owner's only
        _write_private(self.config_path, config.model_dump_json(indent=2))
        if config.api_secret:
            _write_private(self.api_secret_path, config.api_secret + "\n")

    @property
    def api_secret_path(self) -> Path:
        """The controller API secret's file (for clients: AUTOMQ_CONTROLLER_SECRET_FILE)."""
        return self.dir / SECRET_FILE_NAME

    @property
    def admin_credentials_path(self) -> Path:
        return self.dir / ADMIN_CREDENTIALS_FILE

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    def create_admin_credentials(self, config: ClusterConfig) -> dict:
        """A fresh admin login (user `admin`, a random password) saved 0600."""
        creds = {
            "username": ADMIN_USER,
            "password": secrets.token_urlsafe(24),
            "mechanism": "SCRAM-SHA-512",
            "security_protocol": config.security_protocol,
        }
        if config.tls:
            creds["ssl_ca_file"] = str(self.tls_dir / "ca.pem")
        _write_private(self.admin_credentials_path, json.dumps(creds, indent=2) + "\n")
        return creds

    @property
    def broker_credentials_path(self) -> Path:
        return self.dir / BROKER_CREDENTIALS_FILE

    def create_broker_credentials(self) -> dict:
        """A fresh login of the brokers' super user (`broker`, a random password), 0600."""
        creds = {
            "username": BROKER_USER,
            "password": secrets.token_urlsafe(24),
            "mechanism": "SCRAM-SHA-512",
        }
        _write_private(self.broker_credentials_path, json.dumps(creds, indent=2) + "\n")
        return creds

    def broker_credentials(self) -> dict | None:
        """The brokers' inter-broker login of a `--sasl` cluster (None if it has none)."""
        try:
            return json.loads(self.broker_credentials_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{self.broker_credentials_path} is unreadable: {exc}") from None

    def client_security(self) -> dict | None:
        """How the CLI's Kafka clients connect: the admin's SASL login (and the CA with
        --tls), the CA alone on an SSL cluster, None for PLAINTEXT."""
        creds = self.admin_credentials()
        if creds is not None:
            return creds
        if self.exists():
            config = self.load()
            if config.tls and config.security_protocol == "SSL":
                out = {"security_protocol": "SSL", "ssl_ca_file": str(self.tls_dir / "ca.pem")}
                if config.mtls:  # the admin's client certificate (CN admin, a super user)
                    out["ssl_cert_file"] = str(self.tls_dir / "admin.pem")
                    out["ssl_key_file"] = str(self.tls_dir / "admin.key")
                return out
        return None

    def admin_credentials(self) -> dict | None:
        """The admin's SASL login of a `--sasl` cluster (None if it has none)."""
        try:
            return json.loads(self.admin_credentials_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{self.admin_credentials_path} is unreadable: {exc}") from None

    def ensure_api_secret(self, config: ClusterConfig) -> None:
        """Give a config written before controller API auth existed its secret."""
        if config.api_secret is None:
            config.api_secret = generate_secret()
            self.save(config)

    # ------------------------------------------------------------ processes

    def _pid_file(self, name: str) -> tuple[int, str] | None:
        """(pid, start time) from `name`'s PID file if that process is alive, else None."""
        try:
            pid_text, start = self.pid_path(name).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        return (pid, start) if pid > 0 and _proc_start_time(pid) == start else None

    def _s3_data_dir(self) -> Path | None:
        try:
            embedded = self.load().embedded_s3
        except ClusterError:
            return None
        return Path(embedded["data_dir"]) if embedded else None

    def scan(self) -> dict[str, list[int]]:
        """Live processes of this cluster found by their command line (see module doc)."""
        return scan_processes(self.dir, self._s3_data_dir())

    def pids(self, name: str) -> list[int]:
        """Every live process of component `name`: its PID file's (if true) and any other
        whose command line is this component (started by hand, or a stale PID file)."""
        recorded = self._pid_file(name)
        pids = [recorded[0]] if recorded else []
        return pids + [p for p in self.scan().get(name, []) if p not in pids]

    def running(self, name: str) -> int | None:
        """PID of component `name` if it is running: its PID file's process when the file is
        true, else a process found by its command line."""
        recorded = self._pid_file(name)
        if recorded:
            return recorded[0]
        found = self.scan().get(name)
        return found[0] if found else None

    def running_pids(self, config: ClusterConfig) -> dict[str, int]:
        """Running components by name (one /proc scan for those without a true PID file)."""
        names = self.component_names(config)
        result = {n: rec[0] for n in names if (rec := self._pid_file(n))}
        if len(result) < len(names):
            found = self.scan()
            result.update({n: found[n][0] for n in names if n not in result and n in found})
        return {n: result[n] for n in names if n in result}

    def _spawn(self, name: str, argv: list[str], cwd: Path | None = None) -> int:
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # logs of an older cluster were 0644
        with os.fdopen(fd, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(cwd or self.dir),
                env=env,
                umask=0o077,  # WAL, journal and snapshots are not for other users
            )
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

    def check_ports(self, config: ClusterConfig, names: list[str] | None = None) -> None:
        """A clear error if a port of the components `names` (default: all) is taken."""
        busy = [
            f"{what} ({port})"
            for what, port in config.all_ports().items()
            if (names is None or what.split(" ", 1)[0] in names) and port_in_use(port, config.host)
        ]
        if busy:
            raise ClusterError(
                "ports already in use: "
                + ", ".join(busy)
                + ". Stop whatever holds them, or create the cluster with "
                "another --base-port / --dir"
            )

    def start_object_store(
        self, config: ClusterConfig, timeout_s: float = 60.0, name: str = "s3"
    ) -> None:
        """Start one embedded store (`s3`: the main one, `s3-failover`)."""
        self.start_object_stores(config, [name], timeout_s)

    def start_object_stores(
        self, config: ClusterConfig, names: list[str], timeout_s: float = 60.0
    ) -> None:
        """Start the embedded stores `names` at once, then wait until each answers."""
        started = []
        for name in names:
            store = config.embedded_stores().get(name)
            if not store:
                continue
            s3 = SeaweedConfig.from_json(store)
            fixed = s3.ports["admin"] + ADMIN_GRPC_OFFSET
            if (
                s3.ports.get("admin_grpc") != fixed
                and fixed <= 65535
                and not port_in_use(fixed, config.host)
            ):
                # a config written before: move the admin gRPC port to where weed's worker
                # dials
                s3.ports["admin_grpc"] = fixed
                if name == "s3":
                    config.embedded_s3 = s3.to_json()
                else:
                    config.embedded_s3_failover = s3.to_json()
                self.save(config)
            proc = start_seaweed(s3, self.log_path(name))
            self._record_pid(name, proc.pid)
            started.append((s3, proc))
        for s3, proc in started:
            wait_seaweed_ready(s3, timeout_s, proc)

    def start_controller(self, config: ClusterConfig, node_id: int) -> int:
        qpath = self.dir / "quorum.json"
        _write_private(qpath, config.quorum_config().model_dump_json(indent=2))
        return self._spawn(
            f"controller-{node_id}",
            [
                sys.executable,
                "-m",
                "controlplane.server",
                "--config",
                str(qpath),
                "--node-id",
                str(node_id),
                "--data-dir",
                str(self.dir / f"controller-{node_id}"),
            ],
        )

    def start_broker(self, config: ClusterConfig, node_id: int) -> int:
        from dataplane.config import BrokerConfig  # the broker's own config model

        spec = next((b for b in config.brokers if b.node_id == node_id), None)
        if spec is None:
            raise ClusterError(f"broker {node_id} is not part of this cluster")
        bdir = self.dir / f"broker-{node_id}"
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
        login = self.broker_credentials() if config.sasl else None
        endpoints = config.broker_endpoints(spec)
        # brokers talk to each other on the CLI's listener (the inter-broker login needs SASL
        # on a --sasl cluster): it goes first, the rest keep their order
        first = config.client_listener_index()
        endpoints = [endpoints[first]] + endpoints[:first] + endpoints[first + 1 :]
        bcfg = BrokerConfig(
            node_id=node_id,
            az=spec.az,
            host=config.host,
            kafka_port=endpoints[0].port,
            listeners=endpoints if config.listeners else None,
            data_dir=bdir,
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
            tls_client_cert_file=self.tls_dir / "broker.pem" if config.mtls else None,
            tls_client_key_file=self.tls_dir / "broker.key" if config.mtls else None,
            tls_cert_file=self.tls_dir / "server.pem" if config.tls else None,
            tls_key_file=self.tls_dir / "server.key" if config.tls else None,
            tls_ca_file=self.tls_dir / "ca.pem" if config.tls else None,
            inter_broker_sasl_username=login["username"] if login else None,
            inter_broker_sasl_password=login["password"] if login else None,
            inter_broker_sasl_mechanism=login["mechanism"] if login else "SCRAM-SHA-512",
            **storage,
        )
        _write_private(bdir / "broker.json", bcfg.model_dump_json(indent=2))
        return self._spawn(
            f"broker-{node_id}",
            [sys.executable, "-m", "dataplane.node", "--config", str(bdir / "broker.json")],
        )

    def stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S, kill: bool = False) -> bool:
        """Stop every process of one component (SIGTERM, SIGKILL after `timeout_s`; only
        SIGKILL with `kill`) and wait until they are gone. True if one was running."""
        recorded = self._pid_file(name)
        targets = [recorded] if recorded else []
        targets += [
            (p, None) for p in self.scan().get(name, []) if not recorded or p != recorded[0]
        ]
        if not targets:
            self.pid_path(name).unlink(missing_ok=True)
            return False
        left = terminate(targets, 0.0 if kill else timeout_s)
        if left:
            raise ClusterError(
                f"{name} (pid {', '.join(map(str, left))}) is still running after SIGKILL"
            )
        self.pid_path(name).unlink(missing_ok=True)
        return True

    def kill(self, name: str) -> list[int]:
        """kill -9 every process of one component and wait until they are gone (a crash,
        for drills). The PIDs killed; empty if none was running."""
        pids = self.pids(name)
        if pids:
            self.stop(name, kill=True)
        return pids

    def stop_all(self, config: ClusterConfig, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop brokers, then controllers, then the object store; names that were running.
        Finds processes without a true PID file by their command line too."""
        stopped = []
        order = [COMPACTION_SCHEDULER] if self.pids(COMPACTION_SCHEDULER) else []
        order += [n for n in self.component_names(config) if n.startswith("broker-")]
        order += [n for n in self.component_names(config) if n.startswith("controller-")]
        order += [n for n in self.component_names(config) if n in STORE_COMPONENTS]
        for name in order:
            try:
                if self.stop(name, timeout_s):
                    stopped.append(name)
            except ClusterError:
                pass  # the caller sees what is left with running_pids
        return stopped

    def purge(self) -> None:
        """Delete the cluster directory and the embedded stores' data under --store-dir."""
        self._remove_store_dirs()
        if self.dir.exists():
            shutil.rmtree(self.dir)

    def _remove_store_dirs(self) -> None:
        """Delete the stores' data dirs (`s3/`, `s3-failover/`) `create` put under a
        --store-dir outside the cluster directory; the --store-dir itself stays."""
        try:
            config = self.load()
        except ClusterError:
            return
        if config.store_dir is None:
            return
        for component in STORE_COMPONENTS:
            path = Path(config.store_dir) / component
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)

    # ------------------------------------------------------------ a first `up` not done yet

    @property
    def incomplete_path(self) -> Path:
        """Present from `create` until the cluster was healthy once: a directory whose first
        `up` failed, which the next `up` recreates with its own flags."""
        return self.dir / "up-incomplete"

    def incomplete(self) -> bool:
        return self.incomplete_path.exists()

    def mark_complete(self) -> None:
        self.incomplete_path.unlink(missing_ok=True)

    def has_logs(self) -> bool:
        """True if some process of this directory wrote a log line."""
        logs = self.dir / "logs"
        return logs.is_dir() and any(p.stat().st_size > 0 for p in logs.glob("*.log"))

    def remove_created(self) -> None:
        """Delete what `create` and starting the processes put into the directory (and the
        directory itself if it is empty then); anything else in it stays."""
        if not self.dir.exists():
            return
        self._remove_store_dirs()
        for entry in self.dir.iterdir():
            if entry.name in _OWN_ENTRIES or re.fullmatch(r"(controller|broker)-\d+", entry.name):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass  # not empty: the operator's own files


_OWN_ENTRIES = {
    "cluster.json",
    "quorum.json",
    SECRET_FILE_NAME,
    "admin.credentials",
    BROKER_CREDENTIALS_FILE,
    "tls",
    "up-incomplete",
    "s3",
    FAILOVER_STORE,
    "logs",
    "pids",
}

MIB = 1024 * 1024


def check_store_dir(store_dir: Path) -> Path:
    """`cluster up --store-dir` made absolute, or ClusterError: not an existing writable
    directory, or it already holds a store (its s3/ or s3-failover/: another cluster's)."""
    path = Path(os.path.abspath(os.path.expanduser(store_dir)))
    if not path.is_dir():
        raise ClusterError(f"--store-dir {store_dir}: not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ClusterError(f"--store-dir {store_dir}: not writable")
    for component in STORE_COMPONENTS:
        if (path / component).exists():
            raise ClusterError(
                f"--store-dir {store_dir} already holds {component}/ (another cluster's "
                "object store?): give another directory, or delete it"
            )
    return path


def broker_wal_uri(config: ClusterConfig, node_id: int) -> str:
    """An s3 cluster's broker WAL: objects under wal/node-N of the main (first) bucket,
    reached with the brokers' bucket credentials (the URI itself holds no secret)."""
    from dataplane.objectstore.bucket_uri import BucketURI

    main = BucketURI.parse(config.buckets[0].uri).bucket
    return f"s3://{main}/wal/node-{node_id}"


def effective_wal_capacity_bytes(config: ClusterConfig) -> int:
    from dataplane.config import WAL_CAPACITY_BYTES

    return config.broker_wal_capacity_bytes or WAL_CAPACITY_BYTES


def check_listener_flags(
    listeners: str | None, *, sasl: bool, tls: bool
) -> list[ListenerKind] | None:
    """`cluster up --listeners` as listener kinds (None: not given), or ClusterError: an
    unknown protocol, a duplicate name, a SASL listener without --sasl, an SSL one without
    --tls."""
    if listeners is None:
        return None
    try:
        kinds = parse_listener_kinds(listeners)
    except ListenerSpecError as exc:
        raise ClusterError(f"--listeners: {exc}") from None
    for name, protocol in kinds:
        label = f"listener {name}" + ("" if name == protocol else f" ({protocol})")
        if protocol in SASL_PROTOCOLS and not sasl:
            raise ClusterError(f"--listeners: {label} needs --sasl")
        if protocol in TLS_PROTOCOLS and not tls:
            raise ClusterError(f"--listeners: {label} needs --tls")
    if sasl and not any(p in SASL_PROTOCOLS for _, p in kinds):
        raise ClusterError("--sasl needs a SASL listener in --listeners (e.g. PLAINTEXT,SASL_SSL)")
    return [ListenerKind(name=n, security_protocol=p) for n, p in kinds]


def flag_differences(
    config: ClusterConfig,
    *,
    brokers: int | None = None,
    controllers: int | None = None,
    azs: list[str] | None = None,
    base_port: int | None = None,
    bucket_uris: str | None = None,
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
) -> list[str]:
    """The given `cluster up` flags (None: not given) that differ from what `config` was
    created with, each as `--flag VALUE (the cluster has ...)`."""
    from dataplane.config import RETENTION_CHECK_INTERVAL_MS, UPLOAD_INTERVAL_S

    out = []
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
    if bucket_uris is not None:
        if config.embedded_s3:
            out.append("--bucket-uris (the cluster uses the embedded object store)")
        else:
            given = sorted((b.bucket_id, b.uri) for b in _external_buckets(bucket_uris))
            have_b = sorted((b.bucket_id, b.uri) for b in config.buckets)
            if given != have_b:
                out.append(
                    f"--bucket-uris (the cluster uses {', '.join(redact_uri(u) for _, u in have_b)})"
                )
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
    if sasl is not None and sasl != config.sasl:
        out.append(
            f"--{'' if sasl else 'no-'}sasl (the cluster has SASL {'on' if config.sasl else 'off'})"
        )
    if tls is not None and tls != config.tls:
        out.append(
            f"--{'' if tls else 'no-'}tls (the cluster has TLS {'on' if config.tls else 'off'})"
        )
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
    if bucket_secrets_file is not None:
        if config.embedded_s3:
            out.append("--bucket-secrets-file (the cluster uses the embedded object store)")
        else:
            given_keys = _load_secrets(bucket_secrets_file)
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


def _load_secrets(path: Path) -> dict[int, tuple[str, str]]:
    from dataplane.objectstore.secrets_file import BucketSecretsError, load_bucket_secrets

    try:
        return load_bucket_secrets(path)
    except BucketSecretsError as exc:
        raise ClusterError(str(exc)) from None


def _external_buckets(bucket_uris: str, secrets_file: Path | None = None) -> list[BucketConfig]:
    """Bucket configs from `0@s3://b?region=..&endpoint=..,1@s3://...`. Each bucket's
    credentials, first found wins: the URI (accessKey/secretKey), the secrets file
    (AUTOMQ_S3_ACCESS_KEY_<id>/AUTOMQ_S3_SECRET_KEY_<id>, mode 0600), the environment's
    AUTOMQ_S3_ACCESS_KEY_<id>/AUTOMQ_S3_SECRET_KEY_<id>, AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY."""
    from_file = _load_secrets(secrets_file) if secrets_file is not None else {}
    buckets: list[BucketConfig] = []
    for part in [p.strip() for p in bucket_uris.split(",") if p.strip()]:
        if "@" not in part:
            raise ClusterError(f"bucket URI {part!r} needs an id: ID@s3://bucket?...")
        id_text, uri = part.split("@", 1)
        if not id_text.isdigit() or not uri.startswith("s3://"):
            raise ClusterError(f"bucket URI {part!r} must look like 0@s3://bucket?region=..")
        query = (
            dict(q.split("=", 1) for q in uri.split("?", 1)[1].split("&") if "=" in q)
            if "?" in uri
            else {}
        )
        bucket_id = int(id_text)
        env_own = (
            os.environ.get(f"AUTOMQ_S3_ACCESS_KEY_{bucket_id}", ""),
            os.environ.get(f"AUTOMQ_S3_SECRET_KEY_{bucket_id}", ""),
        )
        env_aws = (
            os.environ.get("AWS_ACCESS_KEY_ID", ""),
            os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        )
        if "accessKey" in query:
            keys = (query["accessKey"], query.get("secretKey", ""))
        elif bucket_id in from_file:
            keys = from_file[bucket_id]
        elif all(env_own):
            keys = env_own
        else:
            keys = env_aws
        buckets.append(
            BucketConfig(
                bucket_id=bucket_id,
                uri=f"{id_text}@{redact_uri(uri)}",
                access_key=keys[0],
                secret_key=keys[1],
            )
        )
    unknown = sorted(set(from_file) - {b.bucket_id for b in buckets})
    if unknown:
        raise ClusterError(
            f"{secrets_file} holds credentials of bucket(s) {unknown} that --bucket-uris "
            "does not name"
        )
    ids = [b.bucket_id for b in buckets]
    if not buckets or len(set(ids)) != len(ids):
        raise ClusterError("bucket URIs need distinct ids, e.g. 0@s3://main?..,1@s3://failover?..")
    return buckets


def check_bucket_reachable(bucket: BucketConfig, timeout_s: float = 5.0) -> None:
    """head_bucket with short timeouts: a clear error instead of a hang or a traceback."""
    import boto3
    from botocore.config import Config

    uri = bucket.uri.split("@", 1)[1]
    name = uri[len("s3://") :].split("?", 1)[0]
    query = (
        dict(q.split("=", 1) for q in uri.split("?", 1)[1].split("&") if "=" in q)
        if "?" in uri
        else {}
    )
    client = boto3.client(
        "s3",
        endpoint_url=query.get("endpoint"),
        region_name=query.get("region", "us-east-1"),
        aws_access_key_id=bucket.access_key or None,
        aws_secret_access_key=bucket.secret_key or None,
        config=Config(
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )
    try:
        client.head_bucket(Bucket=name)
    except Exception as exc:
        raise ClusterError(
            f"bucket {bucket.bucket_id} ({redact_uri(uri)}) is not reachable: {exc}"
        ) from None
