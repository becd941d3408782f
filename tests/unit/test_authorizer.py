"""The ACL authorizer (Kafka's semantics) and the enforcer's coverage of every broker API."""

from __future__ import annotations

import pytest

from controlplane.records import AclBinding
from dataplane.kafka.security.authorizer import Authorizer, allows_any
from dataplane.kafka.security.enforcement import (
    SELF_CHECKED_KEYS,
    UNCHECKED_KEYS,
    AclEnforcer,
)


def acl(op: str, name: str = "orders", *, perm: str = "ALLOW", principal: str = "User:alice",
        rtype: str = "TOPIC", pattern: str = "LITERAL", host: str = "*") -> AclBinding:  # fmt: skip
    return AclBinding(
        resource_type=rtype,
        resource_name=name,
        pattern_type=pattern,
        principal=principal,
        host=host,
        operation=op,
        permission=perm,
    )


AUTH = Authorizer(super_users=["User:admin"])


def allowed(acls, op="WRITE", name="orders", principal="User:alice", host="10.0.0.1",
            rtype="TOPIC") -> bool:  # fmt: skip
    return AUTH.authorize(acls, principal, host, op, rtype, name)


def test_nothing_is_allowed_without_an_acl_except_to_super_users():
    assert not allowed([])
    assert allowed([], principal="User:admin")
    assert allowed([acl("WRITE")], principal="User:admin", op="DELETE")


def test_literal_wildcard_and_prefixed_patterns():
    assert allowed([acl("WRITE")])
    assert not allowed([acl("WRITE")], name="orders2")
    assert allowed([acl("WRITE", "*")], name="anything")
    prefixed = [acl("WRITE", "ord", pattern="PREFIXED")]
    assert allowed(prefixed, name="orders") and allowed(prefixed, name="ord")
    assert not allowed(prefixed, name="payments")
    # a literal "ord" is not a prefix
    assert not allowed([acl("WRITE", "ord")], name="orders")


def test_operation_principal_host_and_resource_type_must_match():
    assert not allowed([acl("READ")], op="WRITE")
    assert allowed([acl("ALL")], op="WRITE")
    assert not allowed([acl("WRITE", principal="User:bob")])
    assert allowed([acl("WRITE", principal="User:*")])
    assert not allowed([acl("WRITE", host="10.0.0.2")])
    assert allowed([acl("WRITE", host="10.0.0.1")])
    assert not allowed([acl("WRITE", rtype="GROUP")])


def test_deny_wins_over_allow():
    acls = [acl("ALL"), acl("WRITE", perm="DENY")]
    assert not allowed(acls, op="WRITE")
    assert allowed(acls, op="READ")
    assert not allowed([acl("WRITE"), acl("ALL", "o", perm="DENY", pattern="PREFIXED")])
    assert not allowed([acl("WRITE"), acl("WRITE", perm="DENY", principal="User:*")])


@pytest.mark.parametrize("granted", ["READ", "WRITE", "DELETE", "ALTER", "ALL"])
def test_describe_is_implied(granted):
    assert allowed([acl(granted)], op="DESCRIBE")


def test_describe_configs_implied_by_alter_configs_only():
    assert allowed([acl("ALTER_CONFIGS")], op="DESCRIBE_CONFIGS")
    assert not allowed([acl("WRITE")], op="DESCRIBE_CONFIGS")
    # a DENY of READ does not deny DESCRIBE (Kafka does not widen denials)
    assert allowed([acl("DESCRIBE"), acl("READ", perm="DENY")], op="DESCRIBE")


def test_allows_any_for_idempotent_producers():
    acls = [acl("WRITE", "x")]
    assert allows_any(acls, frozenset(), "User:alice", "h", "WRITE", "TOPIC")
    assert not allows_any(acls, frozenset(), "User:bob", "h", "WRITE", "TOPIC")
    assert not allows_any([acl("READ")], frozenset(), "User:alice", "h", "WRITE", "TOPIC")


def test_every_broker_api_has_an_acl_policy():
    """A broker API without a policy would be super-user only; all of today's have one."""
    from dataplane.kafka.admin_apis import AdminApis
    from dataplane.kafka.api_context import BrokerIdentity
    from dataplane.kafka.apis import KafkaApis
    from dataplane.kafka.groups.handlers import GroupHandlers
    from dataplane.kafka.share import ShareApis

    apis = KafkaApis(
        BrokerIdentity(1, "127.0.0.1", 9092, "az1"),
        lambda: None,
        lambda offset, timeout_s: True,
        None,
        None,
        lambda: 0,
        io_threads=1,
    )
    groups = GroupHandlers.__new__(GroupHandlers)
    admin = AdminApis.__new__(AdminApis)
    share = ShareApis.__new__(ShareApis)  # the share-group APIs (KIP-932)
    handlers = (
        apis.registrations()
        + groups.registrations()
        + admin.registrations()
        + share.registrations()
    )
    keys = {int(cls.API_KEY) for cls, *_ in handlers}
    enforcer = AclEnforcer(AUTH, lambda: None)
    covered = set(enforcer.policies()) | UNCHECKED_KEYS | SELF_CHECKED_KEYS
    assert keys <= covered, sorted(keys - covered)
    apis.io.shutdown()


def test_non_loopback_listeners_need_authentication():
    from controlplane.listeners import insecure_listener_error

    assert insecure_listener_error("Kafka", "127.0.0.1", False) is None
    assert insecure_listener_error("Kafka", "::1", False) is None
    assert insecure_listener_error("Kafka", "localhost", False) is None
    assert "refusing" in insecure_listener_error("Kafka", "0.0.0.0", False)
    assert "refusing" in insecure_listener_error("Kafka", "10.1.2.3", False)
    assert insecure_listener_error("Kafka", "10.1.2.3", True) is None
    assert insecure_listener_error("Kafka", "10.1.2.3", False, allow_insecure=True) is None
