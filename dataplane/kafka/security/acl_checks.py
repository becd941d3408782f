"""The ACL decisions the API rules are made of: may this connection's principal do this
operation on this resource (`AclChecks.allowed`), and the generic per-entry split of a
request (`AclChecks.split`: the allowed entries go to the handler, the denied ones are
answered with the authorization error of their resource type, `DENIED`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.registry import CloseConnection
from dataplane.kafka.security.authorizer import (
    CLUSTER_RESOURCE,
    OPERATIONS,
    SUPPORTED_OPERATIONS,
    Authorizer,
    code_of,
)

__all__ = ["DENIED", "AclChecks", "Handler", "Policy"]

DENIED = {
    "TOPIC": KafkaError.TOPIC_AUTHORIZATION_FAILED,
    "GROUP": KafkaError.GROUP_AUTHORIZATION_FAILED,
    "CLUSTER": KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    "TRANSACTIONAL_ID": KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}

Handler = Callable[[Any, Any], Any]
# an API's rule: (the handler, the request, its context) -> the response
Policy = Callable[[Handler, Any, Any], Awaitable[Any]]


class AclChecks:
    """ACL decisions on the current metadata image's ACLs for a request's context."""

    def __init__(self, authorizer: Authorizer, image_fn: Callable[[], MetadataImage]):
        self.authorizer = authorizer
        self.image_fn = image_fn

    def allowed(self, ctx: Any, operation: str, resource_type: str, name: str) -> bool:
        """Whether the connection's principal may do `operation` on the resource (no
        principal: never)."""
        principal = ctx.extras.get("principal")
        if principal is None:
            return False
        return self.authorizer.authorize(
            self.image_fn().acls.values(), principal, ctx.peer[0], operation, resource_type, name
        )

    def allowed_cluster(self, ctx: Any, operation: str) -> bool:
        """Whether the connection's principal may do `operation` on the cluster."""
        return self.allowed(ctx, operation, "CLUSTER", CLUSTER_RESOURCE)

    def authorized_operations(self, ctx: Any, resource_type: str, name: str) -> set[int]:
        """The wire codes of the operations of the resource type the principal may do on the
        resource (an authorized-operations bitfield of Metadata, DescribeCluster and
        DescribeGroups)."""
        return {
            code_of(OPERATIONS, operation)
            for operation in SUPPORTED_OPERATIONS[resource_type]
            if self.allowed(ctx, operation, resource_type, name)
        }

    def is_super_user(self, ctx: Any) -> bool:
        """Whether the connection's principal is a super user."""
        return ctx.extras.get("principal") in self.authorizer.super_users

    async def split(
        self,
        handler: Handler,
        req: Any,
        ctx: Any,
        *,
        items: str,
        resource: Callable[[Any], tuple[str, str] | None],
        operation: str | Callable[[str, str], bool],
        denied_entry: Callable[[Any, int], Any],
        answer: str,
    ) -> Any:
        """Pass the allowed entries of `req.<items>` to the handler and add a denied answer
        for each other one to `response.<answer>`. `resource(item)` is (type, name), or None
        for an entry the handler should answer itself (e.g. an unknown topic id)."""
        allowed, denied = [], []
        for item in getattr(req, items) or []:
            res = resource(item)
            ok = res is None or (
                operation(*res) if callable(operation) else self.allowed(ctx, operation, *res)
            )
            (allowed if ok else denied).append((item, res))
        if not denied:
            return await handler(req, ctx)
        setattr(req, items, [item for item, _ in allowed])
        response = await handler(req, ctx)
        if response is None:  # Produce acks=0
            return None
        if isinstance(response, (bytes, bytearray)):
            raise CloseConnection("cannot merge denied entries into a pre-encoded response")
        entries = list(getattr(response, answer) or [])
        entries += [denied_entry(item, DENIED[res[0]]) for item, res in denied]
        setattr(response, answer, entries)
        return response

    def topic_id_name(self, topic_id: Any) -> str | None:
        """The name of the topic with this id, or None (no id, unknown id)."""
        if topic_id is None or getattr(topic_id, "int", 0) == 0:
            return None
        topic = self.image_fn().topics.get(str(topic_id))
        return topic.name if topic is not None else None
