"""ACLs enforced on every API of a SASL listener, with Kafka's error codes.

`AclEnforcer.install(registry)` wraps every registered handler: a request's resources are
checked with the pure `Authorizer` against the current metadata image's ACLs before the
handler runs. Per-topic (per-group, per-resource) APIs answer the denied entries with
TOPIC_AUTHORIZATION_FAILED / GROUP_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED (the
one table, dataplane/formats/kafka_errors.py) and pass the allowed rest to the handler; APIs about
one group or the cluster get the whole answer refused; Metadata and ListGroups leave out
what the principal may not DESCRIBE. An API without a policy here is for super users only
(anyone else is disconnected), so a newly registered API is never open by mistake.

Thread-safety: the wrappers run on the server's event loop; the image is immutable.
"""

from __future__ import annotations

from typing import Any

from dataplane.kafka.registry import ApiRegistry, CloseConnection
from dataplane.kafka.security.acl_checks import AclChecks, Handler, Policy
from dataplane.kafka.security.admin_api_acls import AdminApiAcls
from dataplane.kafka.security.data_api_acls import DataApiAcls
from dataplane.kafka.security.group_api_acls import GroupApiAcls
from dataplane.kafka.security.share_api_acls import ShareApiAcls
from dataplane.kafka.security.txn_api_acls import TxnApiAcls

# ApiVersions and the SASL exchange: served before authentication, no resource
UNCHECKED_KEYS = frozenset({17, 18, 36})
# the security admin APIs check the cluster themselves (dataplane/kafka/security/admin_apis.py)
SELF_CHECKED_KEYS = frozenset({29, 30, 31, 50, 51})


class AclEnforcer(AclChecks):
    """Checks requests of authenticated connections against the image's ACLs: the rules of
    `DataApiAcls`, `AdminApiAcls`, `GroupApiAcls` and `TxnApiAcls`, installed around the
    registered handlers."""

    def install(self, registry: ApiRegistry) -> None:
        """Wrap every registered handler (call after all APIs are registered)."""
        for key, _lo, _hi in registry.api_versions():
            if key in UNCHECKED_KEYS or key in SELF_CHECKED_KEYS:
                continue
            reg = registry.get(key)
            assert reg is not None
            policy = self.policies().get(key)
            wrapped = (
                self._wrap(policy, reg.handler)
                if policy is not None
                else self._super_only(reg.handler, reg.request_class.__name__)
            )
            registry.register(
                reg.request_class,
                reg.min_version,
                reg.max_version,
                wrapped,
                in_order=reg.in_order,
                replace=True,
            )

    def _wrap(self, policy: Policy, handler: Handler) -> Handler:
        async def checked(req: Any, ctx: Any) -> Any:
            return await policy(handler, req, ctx)

        return checked

    def _super_only(self, handler: Handler, name: str) -> Handler:
        async def checked(req: Any, ctx: Any) -> Any:
            if not self.is_super_user(ctx):
                raise CloseConnection(f"{name} is for super users only")
            return await handler(req, ctx)

        return checked

    def policies(self) -> dict[int, Policy]:
        """The rule of every API key that has one (the others are for super users only)."""
        return {
            **DataApiAcls(self).policies(),
            **AdminApiAcls(self).policies(),
            **GroupApiAcls(self).policies(),
            **TxnApiAcls(self).policies(),
            **ShareApiAcls(self).policies(),
        }
