"""Beyond one machine: a topology file in, one config per node out, and `node run`.

`automqctl cluster init --topology topo.yaml --out DIR` writes, for every host of the
topology, `DIR/<host>/` with one file per node (`controller-<id>.json`, `broker-<id>.json`)
and the host's `secrets.json` (0600: the Raft password and the controller API secret). The
node files hold no secret: every secret field is a reference, `${secret:NAME}`, resolved by
`automqctl node run --config FILE` from the `secrets.json` beside it (or `--secrets`).
Object-store credentials are never written: brokers and controllers take them from their
environment (`AUTOMQ_S3_ACCESS_KEY_<bucket id>` / `AUTOMQ_S3_SECRET_KEY_<bucket id>`, then
`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, then boto3's chain: profiles, instance roles).

`node run` execs the controller or broker process in the foreground (the process a systemd
unit or a container runs): signals go straight to it, and SIGTERM is a graceful stop.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Literal

import typer
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cli.config_files import merged_sections
from cli.output import OutputFormat, fail, print_data, warn
from controlplane.config import BucketConfig, ControllerAddress, QuorumConfig
from controlplane.listeners import (
    SASL_PROTOCOLS,
    ListenerSpecError,
    listeners_error,
    parse_advertised_listeners,
    parse_listeners,
)
from controlplane.records import BrokerEndpoint
from controlplane.settings import ControllerSettings
from dataplane.config import BrokerConfig
from dataplane.config_mapping import SECRET_KEYS, map_properties, with_known_buckets
from dataplane.config_properties import (
    PropertiesError,
    file_is_private,
    parse_overrides,
    read_properties_file,
)
from dataplane.formats.client_az import parse_az_cidrs
from dataplane.objectstore import parse_bucket_uris

node_app = typer.Typer(help="Run one node of a multi-host cluster.", no_args_is_help=True)

SECRET_REF = re.compile(r"^\$\{secret:([a-z_]+)\}$")
SECRET_NAMES = ("raft_password", "api_secret")
MAX_TOPOLOGY_BYTES = 1024 * 1024
MAX_NODES = 1_000


class ControllerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=0)
    host: str = Field(min_length=1, max_length=253)
    raft_port: int = Field(ge=1, le=65535)
    api_port: int = Field(ge=1, le=65535)
    data_dir: str = "/var/lib/automq/controller-{id}"


class BrokerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=0)
    host: str = Field(min_length=1, max_length=253)
    az: str = Field(min_length=1, max_length=64)
    # one PLAINTEXT listener on host:kafka_port, unless `listeners` is given
    kafka_port: int | None = Field(default=None, ge=1, le=65535)
    # Kafka's `listeners` ("INTERNAL://10.0.0.5:9092,EXTERNAL://10.0.0.5:9093"; an empty host
    # is `host`) and `listener.security.protocol.map` ("INTERNAL:PLAINTEXT,EXTERNAL:SSL");
    # the first listener is the one brokers talk to each other on
    listeners: str | None = Field(default=None, max_length=4096)
    listener_security_protocol_map: str | None = Field(default=None, max_length=4096)
    # Kafka's `advertised.listeners`: the address clients are told for a listener that binds
    # elsewhere ("EXTERNAL://broker1.example.com:9093"); the others are told as they bind
    advertised_listeners: str | None = Field(default=None, max_length=4096)
    # the certificate chain and key of SSL listeners (paths on the broker's host)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    metrics_port: int = Field(default=0, ge=0, le=65535)
    # the shard store (erasure-coded partitions' shards, HTTP with the cluster secret): 0 is
    # any free port, registered with the controllers; pin it to open it in a firewall
    shard_store_port: int = Field(default=0, ge=0, le=65535)
    data_dir: str = "/var/lib/automq/broker-{id}"
    wal_capacity_mib: int | None = Field(default=None, ge=16)
    wal: Literal["file", "s3"] = "file"

    def advertised(self) -> list[BrokerEndpoint] | None:
        """Its listeners as clients are told them (None: as they bind)."""
        if self.advertised_listeners is None:
            return None
        if self.listeners is None:
            raise ValueError(f"broker {self.id}: advertised_listeners needs listeners")
        try:
            bound = parse_listeners(
                self.listeners, self.listener_security_protocol_map, default_host=self.host
            )
            return parse_advertised_listeners(self.advertised_listeners, bound)
        except ListenerSpecError as exc:
            raise ValueError(f"broker {self.id}: {exc}") from None

    def endpoints(self) -> list[BrokerEndpoint]:
        """Its listeners (ValueError with a one-line reason when the spec is invalid)."""
        if self.listeners is None:
            if self.advertised_listeners is not None:
                raise ValueError(f"broker {self.id}: advertised_listeners needs listeners")
            if self.listener_security_protocol_map is not None:
                raise ValueError(f"broker {self.id}: a protocol map needs listeners")
            if self.kafka_port is None:
                raise ValueError(f"broker {self.id}: give kafka_port or listeners")
            return [
                BrokerEndpoint(
                    name="PLAINTEXT",
                    host=self.host,
                    port=self.kafka_port,
                    security_protocol="PLAINTEXT",
                )
            ]
        if self.kafka_port is not None:
            raise ValueError(f"broker {self.id}: give kafka_port or listeners, not both")
        try:
            endpoints = parse_listeners(
                self.listeners, self.listener_security_protocol_map, default_host=self.host
            )
        except ListenerSpecError as exc:
            raise ValueError(f"broker {self.id}: {exc}") from None
        sasl = [e.name for e in endpoints if e.security_protocol in SASL_PROTOCOLS]
        if sasl:
            # topology clusters have no SASL users to log in with (yet)
            raise ValueError(
                f"broker {self.id}: listener {sasl[0]} is SASL, which topology files do not "
                "set up (use PLAINTEXT or SSL listeners)"
            )
        refused = listeners_error(
            endpoints,
            sasl_enabled=False,
            tls_configured=bool(self.tls_cert_file and self.tls_key_file),
            allow_insecure=True,  # checked where the broker starts (`node run --allow-insecure`)
        )
        if refused:
            raise ValueError(f"broker {self.id}: {refused}")
        try:  # what clients are told: an advertised address for each wildcard one
            parse_advertised_listeners(self.advertised_listeners or "", endpoints)
        except ListenerSpecError as exc:
            raise ValueError(f"broker {self.id}: {exc}") from None
        return endpoints


class Topology(BaseModel):
    """A cluster over several hosts (the YAML of `cluster init --topology`)."""

    model_config = ConfigDict(extra="forbid")
    # data buckets, as `cluster up --bucket-uris` takes them, without credentials
    buckets: list[str] = Field(min_length=1, max_length=16)
    controllers: list[ControllerSpec] = Field(min_length=1, max_length=9)
    brokers: list[BrokerSpec] = Field(min_length=1, max_length=MAX_NODES)
    broker_session_timeout_ms: int = Field(default=6_000, ge=500, le=600_000)
    upload_interval_s: float | None = Field(default=None, gt=0, le=3600)
    # client address ranges of each AZ ({az: cidr or [cidrs]}): every broker's
    # zone_router.client_az_cidrs (clients placed by address when they name no AZ)
    client_az_cidrs: dict[str, str | list[str]] = Field(default_factory=dict, max_length=1000)
    # every broker's zone_router.channel_mode (None: the broker's default, "all")
    zone_router_channel_mode: Literal["all", "az_clients"] | None = None

    def cidr_az_map(self) -> dict[str, str]:
        """`client_az_cidrs` as the broker config's {cidr: az} (ValueError: a bad entry)."""
        pairs = []
        for az, cidrs in self.client_az_cidrs.items():
            for cidr in [cidrs] if isinstance(cidrs, str) else cidrs:
                if "," in cidr or "=" in az or "," in az:
                    raise ValueError(f"client_az_cidrs: {az}: {cidr!r} is not one CIDR")
                pairs.append(f"{az}={cidr}")
        return parse_az_cidrs(",".join(pairs))

    @model_validator(mode="after")
    def _check(self) -> Topology:
        for kind, ids in (
            ("controller", [c.id for c in self.controllers]),
            ("broker", [b.id for b in self.brokers]),
        ):
            if len(set(ids)) != len(ids):
                raise ValueError(f"two {kind}s share an id")
        used: dict[tuple[str, int], str] = {}
        for c in self.controllers:
            for port in (c.raft_port, c.api_port):
                _claim(used, (c.host, port), f"controller {c.id}")
        for b in self.brokers:
            for e in b.endpoints():
                _claim(used, (b.host, e.port), f"broker {b.id}")
            for port in (b.metrics_port, b.shard_store_port):
                if port:
                    _claim(used, (b.host, port), f"broker {b.id}")
        for uri in self.buckets:
            if "accesskey" in uri.lower() or "secretkey" in uri.lower():
                raise ValueError(
                    "bucket URIs must not hold credentials: nodes read them from their "
                    "environment (AUTOMQ_S3_ACCESS_KEY_<id>, AWS_ACCESS_KEY_ID, ...)"
                )
        parse_bucket_uris(",".join(self.buckets))  # ValueError names the bad entry
        self.cidr_az_map()  # ValueError names the bad entry
        return self


def _claim(used: dict, key: tuple[str, int], who: str) -> None:
    if key in used:
        raise ValueError(f"{who} and {used[key]} both use {key[0]}:{key[1]}")
    used[key] = who


def load_topology(path: Path) -> Topology:
    """The topology file, validated (ValueError with a one-line reason)."""
    try:
        if path.stat().st_size > MAX_TOPOLOGY_BYTES:
            raise ValueError(f"{path} is larger than {MAX_TOPOLOGY_BYTES} bytes")
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping (buckets, controllers, brokers)")
    try:
        return Topology.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "topology"
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


def node_files(topology: Topology, secret_values: dict[str, str]) -> dict[str, dict[str, dict]]:
    """{host: {file name: node file}} (pure). Secret fields hold `${secret:NAME}`."""
    buckets = [
        BucketConfig(bucket_id=b.bucket_id, uri=uri)
        for b, uri in zip(parse_bucket_uris(",".join(topology.buckets)), topology.buckets)
    ]
    quorum = QuorumConfig(
        controllers=[
            ControllerAddress(node_id=c.id, host=c.host, raft_port=c.raft_port, api_port=c.api_port)
            for c in topology.controllers
        ],
        password=secret_values["raft_password"],
        api_secret=secret_values["api_secret"],
        settings=ControllerSettings(
            broker_session_timeout_ms=topology.broker_session_timeout_ms,
            bucket_ids=[b.bucket_id for b in buckets],
        ),
        buckets=buckets,
    ).model_dump(mode="json")
    quorum["password"] = "${secret:raft_password}"
    quorum["api_secret"] = "${secret:api_secret}"
    out: dict[str, dict[str, dict]] = {}
    for c in topology.controllers:
        out.setdefault(c.host, {})[f"controller-{c.id}.json"] = {
            "kind": "controller",
            "node_id": c.id,
            "data_dir": c.data_dir.format(id=c.id),
            "quorum": quorum,
        }
    api = [f"{c.host}:{c.api_port}" for c in topology.controllers]
    main_bucket = buckets[0].uri.split("@", 1)[1].split("?", 1)[0].removeprefix("s3://")
    for b in topology.brokers:
        extra: dict = {"storage": {}, "wal": {}, "erasure": {}}  # the broker config's sections
        if b.shard_store_port:
            extra["erasure"]["shard_store_port"] = b.shard_store_port
        if b.wal_capacity_mib is not None:
            extra["wal"]["capacity_bytes"] = b.wal_capacity_mib * 1024 * 1024
        if b.wal == "s3":
            extra["wal"]["uri"] = f"s3://{main_bucket}/wal/node-{b.id}"
        if topology.upload_interval_s is not None:
            extra["storage"]["upload_interval_s"] = topology.upload_interval_s
        if topology.client_az_cidrs:
            extra["zone_router"] = {"client_az_cidrs": topology.cidr_az_map()}
        if topology.zone_router_channel_mode is not None:
            extra.setdefault("zone_router", {})["channel_mode"] = topology.zone_router_channel_mode
        endpoints = b.endpoints()
        if b.listeners is not None:
            extra["listeners"] = endpoints
        advertised = b.advertised()
        if advertised is not None:
            extra["advertised_listeners"] = advertised
        if b.tls_cert_file and b.tls_key_file:
            extra["tls_cert_file"] = b.tls_cert_file
            extra["tls_key_file"] = b.tls_key_file
        broker = BrokerConfig(
            node_id=b.id,
            az=b.az,
            host=b.host,
            kafka_port=endpoints[0].port,
            metrics_port=b.metrics_port,
            data_dir=Path(b.data_dir.format(id=b.id)),
            controllers=api,
            bucket_uris=",".join(topology.buckets),
            controller_api_secret=secret_values["api_secret"],
            **extra,
        ).model_dump(mode="json")
        broker["controller_api_secret"] = "${secret:api_secret}"
        out.setdefault(b.host, {})[f"broker-{b.id}.json"] = {"kind": "broker", "broker": broker}
    return out


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def init_topology(topology: Topology, out: Path) -> dict[str, list[str]]:
    """Write every host's node files and secrets under `out`; {host: files}."""
    values = {
        "raft_password": secrets.token_urlsafe(24),
        "api_secret": secrets.token_urlsafe(32),
    }
    written: dict[str, list[str]] = {}
    for host, files in node_files(topology, values).items():
        hdir = out / host
        write_private(hdir / "secrets.json", json.dumps(values, indent=2))
        for name, body in sorted(files.items()):
            write_private(hdir / name, json.dumps(body, indent=2))
        written[host] = ["secrets.json", *sorted(files)]
    return written


def resolve_secrets(value, values: dict[str, str]):
    """`value` with every `${secret:NAME}` string replaced (KeyError names a missing one)."""
    if isinstance(value, dict):
        return {k: resolve_secrets(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_secrets(v, values) for v in value]
    if isinstance(value, str):
        m = SECRET_REF.match(value)
        if m:
            if m.group(1) not in values:
                raise KeyError(m.group(1))
            return values[m.group(1)]
    return value


def broker_with_properties(
    broker: dict, props: dict[str, str], env: dict[str, str], warnings: list[str]
) -> dict:
    """A broker node file's config with a server.properties laid over it (`node run
    --properties`): the file's settings win, its node.id must be the node's, its buckets
    must be the cluster's (same ids); the keys it does not use are added to `warnings`."""
    props = with_known_buckets(props, env, broker.get("bucket_uris"))
    mapping = map_properties(props, "node", env=env, default_host=broker.get("host", "0.0.0.0"))
    warnings.extend(mapping.warnings)
    settings = dict(mapping.settings)
    if "node_id" in settings and settings["node_id"] != broker.get("node_id"):
        raise PropertiesError(f"node.id: {settings['node_id']} is not this node file's id")
    if mapping.bucket_uris is not None:
        ids = sorted(u.bucket_id for u in parse_bucket_uris(mapping.bucket_uris))
        if broker.get("bucket_uris"):
            have = sorted(u.bucket_id for u in parse_bucket_uris(broker["bucket_uris"]))
            if ids != have:
                raise PropertiesError(f"s3.data.buckets: buckets {ids}, the cluster's are {have}")
        settings["bucket_uris"] = mapping.bucket_uris_with_credentials()
    if mapping.wal_in_bucket:
        main = parse_bucket_uris(settings.get("bucket_uris") or broker["bucket_uris"])[0].bucket
        settings.setdefault("wal", {})["uri"] = f"s3://{main}/wal/node-{broker['node_id']}"
    if "listeners" in settings and "advertised_listeners" not in settings:
        settings["advertised_listeners"] = None  # the node file's named its own listeners
    return merged_sections(broker, settings)


def read_node_properties(properties: Path | None, overrides: list[str]) -> dict[str, str] | None:
    """`node run --properties FILE --override k=v`: the keys (None: neither given)."""
    if properties is None and not overrides:
        return None
    props = read_properties_file(properties) if properties is not None else {}
    held = sorted(SECRET_KEYS & props.keys())
    if properties is not None and held and not file_is_private(properties):
        raise PropertiesError(
            f"{held[0]}: {properties} holds bucket credentials but others may read it (chmod 600)"
        )
    props.update(parse_overrides(overrides))
    return props


def process_argv(
    node_file: Path,
    secrets_file: Path,
    allow_insecure: bool = False,
    properties: dict[str, str] | None = None,
    warnings: list[str] | None = None,
) -> tuple[list[str], Path, str]:
    """(argv of the node's process, its runtime config path, its name); writes the runtime
    config (secrets resolved, 0600) into the node's data dir. `allow_insecure`: a listener on
    a non-loopback address may start without authentication (the operator said so).
    `properties`: a broker's server.properties keys laid over its node file (the keys not
    used are appended to `warnings`; PropertiesError names a bad one)."""
    try:
        node = json.loads(node_file.read_text())
        values = json.loads(secrets_file.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{node_file} or {secrets_file} is not valid JSON: {exc}") from None
    try:
        node = resolve_secrets(node, values)
    except KeyError as exc:
        raise ValueError(f"{secrets_file} has no secret {exc.args[0]!r}") from None
    kind = node.get("kind") if isinstance(node, dict) else None
    try:
        if kind == "controller" and properties is not None:
            raise ValueError(f"{node_file}: --properties applies to a broker's node file")
        if kind == "controller":
            quorum = QuorumConfig.model_validate(node["quorum"])
            if allow_insecure:
                quorum = quorum.model_copy(update={"allow_insecure": True})
            data_dir = Path(node["data_dir"])
            runtime = data_dir / "quorum.json"
            write_private(runtime, quorum.model_dump_json(indent=2))
            argv = [
                sys.executable,
                "-m",
                "controlplane.server",
                "--config",
                str(runtime),
                "--node-id",
                str(int(node["node_id"])),
                "--data-dir",
                str(data_dir),
            ]
            return argv, runtime, f"controller-{node['node_id']}"
        if kind == "broker":
            raw = node["broker"]
            if properties is not None:
                raw = broker_with_properties(
                    raw, properties, dict(os.environ), warnings if warnings is not None else []
                )
            broker = BrokerConfig.model_validate(raw)
            if allow_insecure:
                broker = broker.model_copy(update={"allow_insecure": True})
            # the broker refuses these too (before it registers): say it here, before exec
            refused = listeners_error(
                broker.effective_listeners(),
                sasl_enabled=broker.sasl_enabled,
                tls_configured=broker.tls_cert_file is not None and broker.tls_key_file is not None,
                allow_insecure=broker.allow_insecure,
                ssl_client_auth=broker.ssl_client_auth == "required",
            )
            if refused:
                raise ValueError(f"{node_file}: {refused}")
            runtime = broker.data_dir / "broker.json"
            write_private(runtime, broker.model_dump_json(indent=2))
            argv = [sys.executable, "-m", "dataplane.broker", "--config", str(runtime)]
            return argv, runtime, f"broker-{broker.node_id}"
    except (KeyError, TypeError, ValidationError) as exc:
        raise ValueError(f"{node_file} is not a valid {kind} node file: {exc}") from None
    raise ValueError(f"{node_file}: kind must be controller or broker, not {kind!r}")


@node_app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="a node file written by cluster init"),
    secrets_file: Path | None = typer.Option(
        None, "--secrets", help="the host's secrets.json (default: beside --config)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the command, start nothing"),
    allow_insecure: bool = typer.Option(
        False,
        "--allow-insecure",
        help="let a listener on a non-loopback address start without authentication",
    ),
    properties: Path | None = typer.Option(
        None,
        "--properties",
        help="a broker's AutoMQ/Kafka server.properties laid over its node file: caches, "
        "bandwidth, WAL, listeners, log.dirs, buckets and their KAFKA_S3_ACCESS_KEY/"
        "KAFKA_S3_SECRET_KEY (docs/configuration.md); keys not used are named on stderr",
    ),
    override: list[str] | None = typer.Option(
        None, "--override", help="KEY=VALUE replacing a --properties key (repeatable)"
    ),
) -> None:
    """Run one controller or broker in the foreground (for systemd or a container).

    A node that dies is not restarted by this command: let systemd restart it
    (`Restart=on-failure`, `RestartSec=2` in its unit) or the container runtime
    (`--restart on-failure`)."""
    notes: list[str] = []
    try:
        props = read_node_properties(properties, override or [])
        argv, runtime, name = process_argv(
            config, secrets_file or config.parent / "secrets.json", allow_insecure, props, notes
        )
    except ValueError as exc:
        fail(str(exc))
    for line in notes:
        warn(line)
    if dry_run:
        typer.echo(f"{name}: {' '.join(argv)}")
        return
    os.umask(0o077)
    os.execv(argv[0], argv)  # the node becomes this process: signals reach it directly


def init_command(
    topology: Path = typer.Option(..., "--topology", help="topology YAML (see docs/deployment.md)"),
    out: Path = typer.Option(..., "--out", help="where to write one directory per host"),
    bucket_prefix: str | None = typer.Option(
        None,
        "--bucket-prefix",
        help="a key prefix (e.g. cluster-b) for every object of this cluster in its buckets: "
        "a bucket an earlier cluster used can be used again (its WAL and router channels "
        "stay under the old keys); also `prefix=` in a bucket URI",
    ),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Write one config directory per host of a multi-host cluster (node files + secrets)."""
    try:
        topo = load_topology(topology)
    except ValueError as exc:
        fail(str(exc))
    if bucket_prefix:
        from dataplane.objectstore.bucket_uri import with_key_prefix

        try:
            prefixed = [with_key_prefix(u, bucket_prefix) for u in topo.buckets]
        except ValueError as exc:
            fail(f"--bucket-prefix: {exc}")
        topo = topo.model_copy(update={"buckets": prefixed})
    if out.exists() and any(out.iterdir()):
        fail(f"{out} is not empty: choose a new --out (init never overwrites secrets)")
    written = init_topology(topo, out)
    data = {
        "out": str(out),
        "hosts": written,
        "bootstrap_servers": ",".join(
            f"{e.host}:{e.port}"
            for b in topo.brokers
            for e in (b.advertised() or b.endpoints())[:1]
        ),
    }
    if print_data(data, format):
        return
    for host, files in written.items():
        typer.echo(f"{out / host}: {', '.join(files)}")
    typer.echo(
        "copy each directory to its host, then on each host: "
        "automqctl node run --config <dir>/<node>.json (see docs/deployment.md)"
    )
    typer.echo(f"bootstrap servers: {data['bootstrap_servers']}")
