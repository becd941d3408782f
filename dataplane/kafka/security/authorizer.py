"""ACL evaluation as Kafka's StandardAuthorizer does it. Pure: ACLs in, a decision out.

A request by `principal` from `host` to do `operation` on a resource is allowed when the
principal is a super user, or when no matching DENY ACL and at least one matching ALLOW
ACL exist (nothing is allowed without an ACL: Kafka's allow.everyone.if.no.acl.found=false).
An ACL matches when its resource type is the resource's, its pattern matches the name
(LITERAL: the same name or `*`; PREFIXED: a prefix of it), its principal is the principal or
`User:*`, its host the host or `*`, and its operation the operation or ALL. An ALLOW of
READ, WRITE, DELETE or ALTER implies DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS.
DENY is not widened that way (as in Kafka).

Thread-safety: immutable after construction.
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.records import AclBinding

# Kafka's wire codes (org.apache.kafka.common.resource / acl)
RESOURCE_TYPES = {1: "ANY", 2: "TOPIC", 3: "GROUP", 4: "CLUSTER", 5: "TRANSACTIONAL_ID"}
PATTERN_TYPES = {1: "ANY", 2: "MATCH", 3: "LITERAL", 4: "PREFIXED"}
OPERATIONS = {
    1: "ANY",
    2: "ALL",
    3: "READ",
    4: "WRITE",
    5: "CREATE",
    6: "DELETE",
    7: "ALTER",
    8: "DESCRIBE",
    9: "CLUSTER_ACTION",
    10: "DESCRIBE_CONFIGS",
    11: "ALTER_CONFIGS",
    12: "IDEMPOTENT_WRITE",
}
PERMISSIONS = {1: "ANY", 2: "DENY", 3: "ALLOW"}


def code_of(table: dict[int, str], name: str) -> int:
    """The wire code of a name in one of the tables above (0 = UNKNOWN)."""
    return next((code for code, n in table.items() if n == name), 0)


CLUSTER_RESOURCE = "kafka-cluster"  # the one CLUSTER resource's name

# The operations each resource type has (Kafka's AclEntry.supportedOperations): what an
# authorized-operations bitfield may hold; with no authorizer Kafka reports all of them
SUPPORTED_OPERATIONS: dict[str, tuple[str, ...]] = {
    "TOPIC": (
        "READ",
        "WRITE",
        "CREATE",
        "DESCRIBE",
        "DELETE",
        "ALTER",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
    ),
    "GROUP": ("READ", "DESCRIBE", "DELETE"),
    "CLUSTER": (
        "CREATE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
        "ALTER",
        "DESCRIBE",
    ),
    "TRANSACTIONAL_ID": ("DESCRIBE", "WRITE"),
}


def supported_operation_codes(resource_type: str) -> set[int]:
    """The wire codes of every operation of a resource type (the authorized operations of a
    cluster without an authorizer)."""
    return {code_of(OPERATIONS, name) for name in SUPPORTED_OPERATIONS[resource_type]}


_IMPLIED_BY = {
    "DESCRIBE": frozenset({"DESCRIBE", "READ", "WRITE", "DELETE", "ALTER", "ALL"}),
    "DESCRIBE_CONFIGS": frozenset({"DESCRIBE_CONFIGS", "ALTER_CONFIGS", "ALL"}),
}


def _resource_matches(acl: AclBinding, resource_type: str, name: str) -> bool:
    if acl.resource_type != resource_type:
        return False
    if acl.pattern_type == "PREFIXED":
        return name.startswith(acl.resource_name)
    return acl.resource_name in (name, "*")


class Authorizer:
    """Decides requests against a set of ACLs (see the module docstring)."""

    def __init__(self, super_users: Iterable[str] = ()):
        self.super_users = frozenset(super_users)

    def authorize(
        self,
        acls: Iterable[AclBinding],
        principal: str,
        host: str,
        operation: str,
        resource_type: str,
        resource_name: str,
    ) -> bool:
        if principal in self.super_users:
            return True
        allowing = _IMPLIED_BY.get(operation, frozenset({operation, "ALL"}))
        allowed = False
        for acl in acls:
            if acl.principal not in (principal, "User:*") or acl.host not in (host, "*"):
                continue
            if not _resource_matches(acl, resource_type, resource_name):
                continue
            if acl.permission == "DENY":
                if acl.operation in (operation, "ALL"):
                    return False
            elif acl.operation in allowing:
                allowed = True
        return allowed


def allows_any(
    acls: Iterable[AclBinding],
    super_users: frozenset[str],
    principal: str,
    host: str,
    operation: str,
    resource_type: str,
) -> bool:
    """True if some ALLOW ACL lets the principal do `operation` on some resource of the type
    (Kafka's authorizeByResourceType, used for idempotent producers: WRITE on any topic)."""
    if principal in super_users:
        return True
    return any(
        acl.permission == "ALLOW"
        and acl.resource_type == resource_type
        and acl.operation in (operation, "ALL")
        and acl.principal in (principal, "User:*")
        and acl.host in (host, "*")
        for acl in acls
    )
