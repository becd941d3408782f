"""`automqctl user add|list|delete` (SASL/SCRAM users) and `automqctl acl add|list|remove`
(ACLs, in the style of kafka-acls.sh). Both talk to the controller quorum with the cluster's
controller API secret; passwords are hashed here (salted SCRAM hashes are all that is sent
and stored) and never printed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from cli.options import (
    ControllersOption,
    DirOption,
    FormatOption,
    controller_client,
    metadata_image,
    open_cluster,
)
from cli.output import OutputFormat, console, fail, print_data, print_result

user_app = typer.Typer(
    help="Users: SASL/SCRAM credentials (salted hashes in the metadata quorum) and mutual-TLS "
    "client certificates."
)
acl_app = typer.Typer(help="ACLs, enforced with SASL or mutual TLS on (kafka-acls.sh style).")

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MIN_PASSWORD_CHARS = 8
OPERATIONS = (
    "All",
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "DescribeConfigs",
    "AlterConfigs",
    "IdempotentWrite",
)


def _controller_error(exc: Exception) -> str:
    return f"the controller refused: {exc}"


# ---------------------------------------------------------------- users


@user_app.command("add")
def user_add(
    name: str = typer.Argument(..., help="user name (the principal is User:NAME)"),
    password: str = typer.Option(
        ..., "--password", prompt=True, hide_input=True, help="the user's password"
    ),
    mechanism: list[str] = typer.Option(
        list(MECHANISMS), "--mechanism", help="SCRAM-SHA-256 and/or SCRAM-SHA-512 (default both)"
    ),
    iterations: int = typer.Option(4096, min=4096, max=16384),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Add a user or change its password (PLAIN logins are checked against the same hashes)."""
    from controlplane.errors import ControllerError
    from controlplane.requests import AlterScramCredentialsRequest
    from controlplane.security import scram_upsertion

    bad = [m for m in mechanism if m not in MECHANISMS]
    if bad or not mechanism:
        fail(f"--mechanism must be one of {', '.join(MECHANISMS)} (got {', '.join(bad)})")
    if len(password) < MIN_PASSWORD_CHARS:
        fail(f"the password needs at least {MIN_PASSWORD_CHARS} characters")
    if not name or len(name) > 256 or any(c in name for c in "\0\n\r"):
        fail("the user name must be 1-256 printable characters")
    req = AlterScramCredentialsRequest(
        upsertions=[
            scram_upsertion(name, m, password, iterations) for m in dict.fromkeys(mechanism)
        ]
    )
    try:
        result = controller_client(dir, controllers).alter_scram_credentials(req)
    except ControllerError as exc:
        fail(_controller_error(exc))
    refused = [r for r in result.results if r.error]
    if refused:
        fail(f"user {name}: {refused[0].error} {refused[0].message}")
    mechanisms = list(dict.fromkeys(mechanism))
    print_result(
        {"user": name, "saved": mechanisms},
        format,
        f"user [bold]{escape(name)}[/] saved ({', '.join(mechanisms)})",
    )


@user_app.command("list")
def user_list(
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Users with their SCRAM mechanisms and iterations (never a hash)."""
    image = metadata_image(controller_client(dir, controllers))
    users: dict[str, list[dict]] = {}
    for c in sorted(image.scram_credentials.values(), key=lambda c: (c.user, c.mechanism)):
        users.setdefault(c.user, []).append({"mechanism": c.mechanism, "iterations": c.iterations})
    rows = [{"user": u, "credentials": creds} for u, creds in users.items()]
    if print_data(rows, format):
        return
    table = Table("user", "mechanisms")
    for row in rows:
        table.add_row(
            row["user"],
            ", ".join(f"{c['mechanism']} ({c['iterations']})" for c in row["credentials"]),
        )
    console.print(table)


@user_app.command("delete")
def user_delete(
    name: str = typer.Argument(...),
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Delete a user's credentials (its open connections stay until they reconnect)."""
    from controlplane.errors import ControllerError
    from controlplane.requests import AlterScramCredentialsRequest, ScramDeletion

    client = controller_client(dir, controllers)
    image = metadata_image(client)
    have = [c.mechanism for c in image.scram_credentials.values() if c.user == name]
    if not have:
        fail(f"no user {name!r}")
    try:
        client.alter_scram_credentials(
            AlterScramCredentialsRequest(
                deletions=[ScramDeletion(user=name, mechanism=m) for m in sorted(have)]
            )
        )
    except ControllerError as exc:
        fail(_controller_error(exc))
    print_result(
        {"user": name, "deleted": sorted(have)}, format, f"user [bold]{escape(name)}[/] deleted"
    )


@user_app.command("cert")
def user_cert(
    name: str = typer.Argument(..., help="the certificate's CN: the principal is User:NAME"),
    out: Path | None = typer.Option(
        None, "--out", help="where to write NAME.pem and NAME.key (default DIR/tls/clients)"
    ),
    dir: Path = DirOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Issue a client certificate for mutual TLS (`cluster up --tls --mtls`), signed by the
    cluster CA: NAME.pem (certificate + CA) and NAME.key (0600). Never overwrites."""
    import re

    from cli.tls import generate_client_cert

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        fail("the name must be 1-64 letters, digits, '.', '_' or '-'")
    cluster, config = open_cluster(dir)
    if not config.tls or not (cluster.tls_dir / "ca.key").exists():
        fail(f"the cluster in {cluster.dir} has no CA of its own (create it with --tls)")
    target = out if out is not None else cluster.tls_dir / "clients"
    taken = [p for p in (target / f"{name}.pem", target / f"{name}.key") if p.exists()]
    if taken:
        fail(f"{taken[0]} exists: remove it first or choose another --out")
    paths = generate_client_cert(cluster.tls_dir, name, name, target)
    data = {
        "principal": f"User:{name}",
        "certificate": str(paths["cert"]),
        "key": str(paths["key"]),
        "ca": str(cluster.tls_dir / "ca.pem"),
    }
    if print_data(data, format):
        return
    console.print(
        f"User:{name}: certificate {data['certificate']}, key {data['key']} (0600); "
        f"clients trust {data['ca']}",
        soft_wrap=True,
    )


# ---------------------------------------------------------------- ACLs


def _operation(name: str) -> str:
    """Kafka's CamelCase operation name (`Write`, `IdempotentWrite`) to the stored one."""
    by_lower = {o.lower(): o for o in OPERATIONS}
    found = by_lower.get(name.replace("_", "").replace("-", "").lower())
    if found is None:
        fail(f"--operation {name!r} is not one of {', '.join(OPERATIONS)}")
    out = ""
    for i, ch in enumerate(found):
        out += ("_" if i and ch.isupper() else "") + ch.upper()
    return out


def _resources(
    topic: str | None, group: str | None, cluster: bool, transactional_id: str | None
) -> list[tuple[str, str]]:
    chosen = [("TOPIC", topic), ("GROUP", group), ("TRANSACTIONAL_ID", transactional_id)]
    out = [(t, n) for t, n in chosen if n is not None]
    if cluster:
        out.append(("CLUSTER", "kafka-cluster"))
    return out


def _bindings(
    allow: list[str],
    deny: list[str],
    operations: list[str],
    resources: list[tuple[str, str]],
    pattern: str,
    host: str,
) -> list:
    from pydantic import ValidationError

    from controlplane.records import AclBinding

    out = []
    for permission, principals in (("ALLOW", allow), ("DENY", deny)):
        for principal in principals:
            if ":" not in principal:
                fail(f"principal {principal!r} must look like User:NAME (or User:*)")
            for op in operations:
                for rtype, rname in resources:
                    try:
                        out.append(
                            AclBinding(
                                resource_type=rtype,
                                resource_name=rname,
                                pattern_type=pattern.upper(),
                                principal=principal,
                                host=host,
                                operation=_operation(op),
                                permission=permission,
                            )
                        )
                    except ValidationError as exc:
                        fail(f"invalid ACL: {exc.errors()[0]['msg']}")
    return out


_ALLOW = typer.Option([], "--allow-principal", help="User:NAME allowed (repeatable)")
_DENY = typer.Option([], "--deny-principal", help="User:NAME denied (repeatable)")
_OPERATION = typer.Option([], "--operation", help=f"one of {', '.join(OPERATIONS)} (repeatable)")
_TOPIC = typer.Option(None, "--topic", help="a topic name, `*`, or a prefix (--prefixed)")
_GROUP = typer.Option(None, "--group", help="a consumer group name, `*`, or a prefix")
_CLUSTER = typer.Option(False, "--cluster", help="the cluster resource")
_TXN = typer.Option(None, "--transactional-id", help="a transactional id, `*`, or a prefix")
_PATTERN = typer.Option(
    "literal", "--resource-pattern-type", help="literal or prefixed", case_sensitive=False
)
_HOST = typer.Option("*", "--host", help="client address the ACL applies to (default any)")


@acl_app.command("add")
def acl_add(
    allow_principal: list[str] = _ALLOW,
    deny_principal: list[str] = _DENY,
    operation: list[str] = _OPERATION,
    topic: str | None = _TOPIC,
    group: str | None = _GROUP,
    cluster: bool = _CLUSTER,
    transactional_id: str | None = _TXN,
    resource_pattern_type: str = _PATTERN,
    host: str = _HOST,
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Add ACLs: every principal x operation x resource given."""
    from controlplane.errors import ControllerError
    from controlplane.requests import CreateAclsRequest

    if not allow_principal and not deny_principal:
        fail("give --allow-principal and/or --deny-principal")
    if not operation:
        fail("give at least one --operation")
    resources = _resources(topic, group, cluster, transactional_id)
    if not resources:
        fail("give a resource: --topic, --group, --cluster or --transactional-id")
    if resource_pattern_type.lower() not in ("literal", "prefixed"):
        fail("--resource-pattern-type must be literal or prefixed")
    bindings = _bindings(
        allow_principal, deny_principal, operation, resources, resource_pattern_type, host
    )
    try:
        controller_client(dir, controllers).create_acls(CreateAclsRequest(bindings=bindings))
    except ControllerError as exc:
        fail(_controller_error(exc))
    print_result({"added": len(bindings)}, format, f"{len(bindings)} ACL(s) added")


def _acl_rows(image, flt) -> list[dict]:
    from controlplane.security import acl_matches

    return [
        b.model_dump()
        for b in sorted(image.acls.values(), key=lambda b: b.model_dump_json())
        if acl_matches(b, flt)
    ]


@acl_app.command("list")
def acl_list(
    principal: str | None = typer.Option(None, "--principal"),
    topic: str | None = _TOPIC,
    group: str | None = _GROUP,
    cluster: bool = _CLUSTER,
    transactional_id: str | None = _TXN,
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """ACLs, optionally of one principal or resource."""
    from controlplane.requests import AclFilter

    resources = _resources(topic, group, cluster, transactional_id)
    if len(resources) > 1:
        fail("give at most one of --topic, --group, --cluster, --transactional-id")
    rtype, rname = resources[0] if resources else (None, None)
    rows = _acl_rows(
        metadata_image(controller_client(dir, controllers)),
        AclFilter(principal=principal, resource_type=rtype, resource_name=rname),
    )
    if print_data(rows, format):
        return
    table = Table("principal", "permission", "operation", "resource", "pattern", "host")
    for r in rows:
        table.add_row(
            r["principal"],
            r["permission"],
            r["operation"],
            f"{r['resource_type']}:{r['resource_name']}",
            r["pattern_type"],
            r["host"],
        )
    console.print(table)


@acl_app.command("remove")
def acl_remove(
    allow_principal: list[str] = _ALLOW,
    deny_principal: list[str] = _DENY,
    operation: list[str] = _OPERATION,
    topic: str | None = _TOPIC,
    group: str | None = _GROUP,
    cluster: bool = _CLUSTER,
    transactional_id: str | None = _TXN,
    resource_pattern_type: str = _PATTERN,
    host: str = _HOST,
    dir: Path = DirOption,
    controllers: str | None = ControllersOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Remove the ACLs these flags describe (the same flags as `acl add`)."""
    from controlplane.errors import ControllerError
    from controlplane.requests import AclFilter, DeleteAclsRequest

    if not allow_principal and not deny_principal:
        fail("give --allow-principal and/or --deny-principal")
    resources = _resources(topic, group, cluster, transactional_id)
    if not resources or not operation:
        fail("give --operation and a resource (--topic, --group, --cluster, --transactional-id)")
    bindings = _bindings(
        allow_principal, deny_principal, operation, resources, resource_pattern_type, host
    )
    try:
        result = controller_client(dir, controllers).delete_acls(
            DeleteAclsRequest(filters=[AclFilter(**b.model_dump()) for b in bindings])
        )
    except ControllerError as exc:
        fail(_controller_error(exc))
    removed = sum(len(m) for m in result.matches)
    if not removed:
        fail("no such ACL")
    print_result({"removed": removed}, format, f"{removed} ACL(s) removed")
