"""One local cluster directory (see cli/cluster_config.py for its layout): creating its
config and secrets, starting, finding and stopping its processes through PID files
("pid start_time", only trusted while that very process lives) and the /proc scan of
cli/os_processes.py, and removing what it created."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from cli.cluster_config import (
    ADMIN_CREDENTIALS_FILE,
    ADMIN_USER,
    BROKER_CREDENTIALS_FILE,
    BROKER_USER,
    COMPACTION_SCHEDULER,
    FAILOVER_STORE,
    STORE_COMPONENTS,
    SUPERVISOR,
    ClusterConfig,
    ClusterError,
)
from cli.cluster_layout import (
    PORTS_PER_STORE,
    broker_specs,
    check_create_flags,
    cluster_ports,
    controller_addresses,
    controller_settings,
    embedded_store_configs,
    port_allocator,
    prefixed_buckets,
)
from cli.config_files import broker_config, read_login, write_new_login, write_private
from cli.external_buckets import external_buckets
from cli.os_processes import proc_age_s, proc_start_time, scan_processes, terminate
from cli.port_allocator import parse_port_range
from controlplane.auth import SECRET_FILE_NAME, generate_secret
from dataplane.objectstore.seaweed import (
    ADMIN_GRPC_OFFSET,
    SeaweedConfig,
    port_in_use,
    start_seaweed,
    wait_seaweed_ready,
)

STOP_TIMEOUT_S = 15.0


class LocalCluster:
    """Creates, starts, inspects and stops the processes of one cluster directory."""

    def __init__(self, directory: Path):
        self.dir = Path(directory).expanduser().resolve()

    # ------------------------------------------------------------ paths and config

    @property
    def config_path(self) -> Path:
        """cluster.json."""
        return self.dir / "cluster.json"

    def exists(self) -> bool:
        """True if the directory holds a cluster config."""
        return self.config_path.exists()

    def load(self) -> ClusterConfig:
        """The cluster's config, or ClusterError (no cluster, or an invalid config)."""
        if not self.exists():
            raise ClusterError(f"no cluster in {self.dir} (run `automqctl cluster up`)")
        try:
            return ClusterConfig.model_validate_json(self.config_path.read_text())
        except ValueError as exc:
            raise ClusterError(f"{self.config_path} is not a valid cluster config: {exc}") from None

    def log_path(self, name: str) -> Path:
        """Component `name`'s log file."""
        return self.dir / "logs" / f"{name}.log"

    def pid_path(self, name: str) -> Path:
        """Component `name`'s PID file ("pid start_time")."""
        return self.dir / "pids" / f"{name}.pid"

    def component_names(self, config: ClusterConfig) -> list[str]:
        """Every component: the embedded stores, controllers, brokers, the scheduler, the
        supervisor (`cluster up --supervise`)."""
        names = self.supervised_names(config)
        if (self.dir / "compaction" / "schedule.json").exists():
            names.append(COMPACTION_SCHEDULER)  # `compaction schedule` made it a component
        if config.supervise:
            names.append(SUPERVISOR)
        return names

    def supervised_names(self, config: ClusterConfig) -> list[str]:
        """The components a supervisor restarts: embedded stores, controllers, brokers."""
        names = list(config.embedded_stores())
        names += [f"controller-{c.node_id}" for c in config.controllers]
        names += [f"broker-{b.node_id}" for b in config.brokers]
        return names

    def held(self, name: str) -> bool:
        """Was component `name` stopped on purpose (a supervisor leaves it down)?"""
        return self._held_path(name).exists()

    def _held_path(self, name: str) -> Path:
        return self.dir / "pids" / f"{name}.held"

    @contextlib.contextmanager
    def start_lock(self, name: str) -> Iterator[None]:
        """Held while component `name` is being started, so the supervisor and a CLI
        command (`cluster up`, `broker start`) never start it twice: an flock on
        pids/NAME.lock, which the kernel releases if the holder dies. Blocks until free
        (a start holds it only while it spawns the process, not while it waits for it)."""
        path = self.dir / "pids" / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def start_supervisor(self) -> int:
        """The process that restarts crashed components (cli/supervisor.py)."""
        return self._spawn(
            SUPERVISOR, [sys.executable, "-m", "cli.supervisor", "--dir", str(self.dir)]
        )

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
        broker_overrides: dict | None = None,
        client_az_cidrs: dict[str, str] | None = None,
        bucket_prefix: str | None = None,
        port_range: str | None = None,
    ) -> ClusterConfig:
        """Write a new cluster config with fresh ports and secrets (nothing is written when
        the flags are invalid)."""
        store_dir, kinds = check_create_flags(
            brokers=brokers,
            controllers=controllers,
            azs=azs,
            bucket_uris=bucket_uris,
            sasl=sasl,
            tls=tls,
            listeners=listeners,
            mtls=mtls,
            bucket_secrets_file=bucket_secrets_file,
            store_dir=store_dir,
        )
        per_broker = len(kinds) if kinds else 1
        broker_ports = brokers * (per_broker + 1)  # its listeners' ports and its metrics port
        # two embedded stores (main: bucket 0, failover: bucket 1)
        needed = controllers * 2 + broker_ports + (0 if bucket_uris else 2 * PORTS_PER_STORE)
        allocator = port_allocator(base_port, port_range)
        ports = cluster_ports(needed, base_port, not bucket_uris, allocator)
        host = "127.0.0.1"
        stores_at = controllers * 2 + broker_ports
        embedded: dict | None = None
        embedded_failover: dict | None = None
        if bucket_uris:
            buckets = external_buckets(bucket_uris, bucket_secrets_file)
        else:
            embedded, embedded_failover, buckets = embedded_store_configs(
                store_dir or self.dir, ports[stores_at:], allocator
            )
        if bucket_prefix:
            buckets = prefixed_buckets(buckets, bucket_prefix)
        specs = broker_specs(ports[controllers * 2 : stores_at], brokers, azs, kinds)
        if allocator is not None:  # the shard stores' ports from the same range
            for spec, port in zip(specs, allocator.take(brokers), strict=True):
                spec.shard_store_port = port
        config = ClusterConfig(
            host=host,
            controllers=controller_addresses(host, ports, controllers),
            brokers=specs,
            password=secrets.token_urlsafe(24),
            api_secret=generate_secret(),
            settings=controller_settings(
                buckets, session_timeout_ms, object_delete_delay_s, failover_detect_s
            ),
            embedded_s3=embedded,
            embedded_s3_failover=embedded_failover,
            store_dir=str(store_dir) if store_dir is not None else None,
            buckets=buckets,
            broker_wal_capacity_bytes=wal_capacity_bytes,
            broker_upload_interval_s=upload_interval_s,
            broker_retention_check_interval_s=retention_check_interval_s,
            broker_overrides=broker_overrides or {},
            client_az_cidrs=client_az_cidrs or {},
            broker_wal=wal,
            azs=list(azs),
            base_port=base_port,
            port_range=list(parse_port_range(port_range)) if port_range else None,
            sasl=sasl,
            tls=tls,
            tls_dir=str(self.tls_dir.resolve()) if tls else None,
            listeners=kinds,
            mtls=mtls,
        )
        if tls:
            self._create_certificates(host, mtls)
        self.save(config)
        self.incomplete_path.write_text(
            "the first `cluster up` of this directory has not finished\n"
        )
        return config

    def _create_certificates(self, host: str, mtls: bool) -> None:
        """The cluster CA and the brokers' server certificate; with --mtls the admin's and
        the brokers' client certificates."""
        from cli.tls import generate_ca_and_server_cert, generate_client_cert

        self.dir.mkdir(parents=True, exist_ok=True)
        generate_ca_and_server_cert(self.tls_dir, ips=[host], dns_names=["localhost"])
        if mtls:
            generate_client_cert(self.tls_dir, ADMIN_USER, "admin")
            generate_client_cert(self.tls_dir, BROKER_USER, "broker")

    def save(self, config: ClusterConfig) -> None:
        """Write cluster.json and the controller API secret (0600, the directory 0700)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)  # WAL, journal, logs and secrets: the owner's only
        write_private(self.config_path, config.model_dump_json(indent=2))
        if config.api_secret:
            write_private(self.api_secret_path, config.api_secret + "\n")

    @property
    def api_secret_path(self) -> Path:
        """The controller API secret's file (for clients: AUTOMQ_CONTROLLER_SECRET_FILE)."""
        return self.dir / SECRET_FILE_NAME

    @property
    def admin_credentials_path(self) -> Path:
        """The admin's SASL login (`--sasl`)."""
        return self.dir / ADMIN_CREDENTIALS_FILE

    @property
    def tls_dir(self) -> Path:
        """The cluster CA and certificates (`--tls`)."""
        return self.dir / "tls"

    def create_admin_credentials(self, config: ClusterConfig) -> dict:
        """A fresh admin login (user `admin`, a random password) saved 0600."""
        tls = {"ssl_ca_file": str(self.tls_dir / "ca.pem")} if config.tls else {}
        return write_new_login(
            self.admin_credentials_path,
            ADMIN_USER,
            security_protocol=config.security_protocol,
            **tls,
        )

    @property
    def broker_credentials_path(self) -> Path:
        """The brokers' inter-broker SASL login (`--sasl`)."""
        return self.dir / BROKER_CREDENTIALS_FILE

    def create_broker_credentials(self) -> dict:
        """A fresh login of the brokers' super user (`broker`, a random password), 0600."""
        return write_new_login(self.broker_credentials_path, BROKER_USER)

    def broker_credentials(self) -> dict | None:
        """The brokers' inter-broker login of a `--sasl` cluster (None if it has none)."""
        return read_login(self.broker_credentials_path)

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
        return read_login(self.admin_credentials_path)

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
        return (pid, start) if pid > 0 and proc_start_time(pid) == start else None

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
        """Start component `name` unless it already runs (the supervisor, or another
        command, may have started it meanwhile); its PID either way."""
        with self.start_lock(name):
            self._held_path(name).unlink(missing_ok=True)  # started: supervised again
            pid = self.running(name)
            return pid if pid is not None else self._spawn_locked(name, argv, cwd)

    def _spawn_locked(self, name: str, argv: list[str], cwd: Path | None) -> int:
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
            start = proc_start_time(pid)
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
            with self.start_lock(name):
                self._held_path(name).unlink(missing_ok=True)
                if self.running(name) is not None:
                    continue  # the supervisor (or another command) started it meanwhile
                proc = start_seaweed(s3, self.log_path(name))
                self._record_pid(name, proc.pid)
            started.append((name, s3, proc))
        for name, s3, proc in started:
            wait_seaweed_ready(s3, timeout_s, proc)
            # when it began to answer: writes that failed before were not its own
            write_private(self._ready_path(name), f"{proc.pid} {time.time()}")

    def _ready_path(self, name: str) -> Path:
        return self.dir / "pids" / f"{name}.ready"

    def store_answering_s(self, name: str, pid: int) -> float | None:
        """How long store `name` (running as `pid`) has answered: since the start that
        waited for it to answer, or since its process started when another start did; None
        when its process is gone."""
        age_s = proc_age_s(pid)
        try:
            ready_pid, ready_at = self._ready_path(name).read_text().split()
            if int(ready_pid) == pid and age_s is not None:
                return max(0.0, min(age_s, time.time() - float(ready_at)))
        except (OSError, ValueError):
            pass
        return age_s

    def start_controller(self, config: ClusterConfig, node_id: int) -> int:
        """Write quorum.json (0600) and start controller `node_id`; its PID."""
        qpath = self.dir / "quorum.json"
        write_private(qpath, config.quorum_config().model_dump_json(indent=2))
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
        """Write broker `node_id`'s config (broker-N/broker.json, 0600) and start it."""
        spec = next((b for b in config.brokers if b.node_id == node_id), None)
        if spec is None:
            raise ClusterError(f"broker {node_id} is not part of this cluster")
        bdir = self.dir / f"broker-{node_id}"
        login = self.broker_credentials() if config.sasl else None
        bcfg = broker_config(config, spec, bdir, self.tls_dir, login)
        write_private(bdir / "broker.json", bcfg.model_dump_json(indent=2))
        return self._spawn(
            f"broker-{node_id}",
            [sys.executable, "-m", "dataplane.broker", "--config", str(bdir / "broker.json")],
        )

    def stop(
        self, name: str, timeout_s: float = STOP_TIMEOUT_S, kill: bool = False, hold: bool = True
    ) -> bool:
        """Stop every process of one component (SIGTERM, SIGKILL after `timeout_s`; only
        SIGKILL with `kill`) and wait until they are gone. True if one was running.
        `hold`: stopped on purpose, the supervisor leaves it down until it is started
        again (a pids/NAME.held marker); without it, a crash the supervisor restarts."""
        recorded = self._pid_file(name)
        if hold and name != SUPERVISOR:
            self._held_path(name).parent.mkdir(parents=True, exist_ok=True)
            self._held_path(name).touch()
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
        if self._pid_file(name) is None:  # not a new process the supervisor started already
            self.pid_path(name).unlink(missing_ok=True)
        return True

    def kill(self, name: str) -> list[int]:
        """kill -9 every process of one component and wait until they are gone (a crash,
        for drills: a supervised cluster's supervisor restarts it, as it would after any
        crash). The PIDs killed; empty if none was running."""
        pids = self.pids(name)
        if pids:
            self.stop(name, kill=True, hold=False)
        return pids

    def stop_all(self, config: ClusterConfig, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
        """Stop brokers, then controllers, then the object store; names that were running.
        Finds processes without a true PID file by their command line too."""
        stopped = []
        # the supervisor first: it would restart what is being stopped
        order = [SUPERVISOR] if self.pids(SUPERVISOR) else []
        order += [COMPACTION_SCHEDULER] if self.pids(COMPACTION_SCHEDULER) else []
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
        """True while the directory's first `up` has not finished."""
        return self.incomplete_path.exists()

    def mark_complete(self) -> None:
        """The first `up` finished: the directory is a cluster of its own now."""
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
