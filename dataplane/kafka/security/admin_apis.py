"""The security admin APIs on the Kafka listener, so Kafka's tools manage users and ACLs:
CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials and
AlterUserScramCredentials. Writes go to the controller quorum (controlplane/security.py);
the broker answers once its own image has the change, so a following request sees it.

On a SASL listener the cluster is checked here (DESCRIBE for the two describes, ALTER for
the three writes: CLUSTER_AUTHORIZATION_FAILED otherwise); on a PLAINTEXT listener these
APIs are open like every other. Thread-safety: handlers run on the server's event loop,
controller calls on a small private executor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage
from controlplane.records import AclBinding
from controlplane.requests import (
    AclFilter,
    AlterScramCredentialsRequest,
    CreateAclsRequest,
    DeleteAclsRequest,
    ScramUpsertion,
)
from controlplane.security import b64, keys_from_salted_password, scram_key
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.security.authorizer import (
    OPERATIONS,
    PATTERN_TYPES,
    PERMISSIONS,
    RESOURCE_TYPES,
    code_of,
)

log = logging.getLogger(__name__)

METADATA_WAIT_S = 10.0
SCRAM_MECHANISM_CODES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds

# check(ctx, operation on the cluster) -> allowed?
ClusterCheck = Callable[[Any, str], bool]


def _wire_filter(f: Any) -> AclFilter:
    """An AclFilter from a DescribeAcls/DeleteAcls wire filter (ANY = None)."""

    def named(table: dict[int, str], code: int) -> str | None:
        name = table.get(int(code))
        return None if name in (None, "ANY") else name

    pattern = named(PATTERN_TYPES, getattr(f, "pattern_type_filter", 3))
    return AclFilter(
        resource_type=named(RESOURCE_TYPES, f.resource_type_filter),
        resource_name=f.resource_name_filter,
        pattern_type=pattern,
        principal=f.principal_filter,
        host=f.host_filter,
        operation=named(OPERATIONS, f.operation),
        permission=named(PERMISSIONS, f.permission_type),
    )


def filter_matches(binding: AclBinding, flt: AclFilter) -> bool:
    """Kafka's filter semantics: None matches anything; pattern MATCH selects the ACLs that
    apply to the named resource (literal, `*`, or a prefix of it)."""
    if flt.resource_type is not None and binding.resource_type != flt.resource_type:
        return False
    if flt.pattern_type == "MATCH":
        if flt.resource_name is not None:
            name = flt.resource_name
            if binding.pattern_type == "PREFIXED":
                if not name.startswith(binding.resource_name):
                    return False
            elif binding.resource_name not in (name, "*"):
                return False
    else:
        if flt.pattern_type is not None and binding.pattern_type != flt.pattern_type:
            return False
        if flt.resource_name is not None and binding.resource_name != flt.resource_name:
            return False
    for name in ("principal", "host", "operation", "permission"):
        wanted = getattr(flt, name)
        if wanted is not None and getattr(binding, name) != wanted:
            return False
    return True


class SecurityAdminApis:
    """Handlers of the five security admin APIs."""

    def __init__(
        self,
        controller: ControllerCalls,
        image_fn: Callable[[], MetadataImage],
        wait_for_offset: Callable[[int, float], bool],
        check: ClusterCheck | None = None,
    ):
        self.controller = controller
        self.image_fn = image_fn
        self.wait_for_offset = wait_for_offset
        self.check = check
        self.io = ThreadPoolExecutor(2, thread_name_prefix="kafka-security")

    def registrations(self) -> list:
        from kafka.protocol.admin import (
            AlterUserScramCredentialsRequest,
            CreateAclsRequest,
            DeleteAclsRequest,
            DescribeAclsRequest,
            DescribeUserScramCredentialsRequest,
        )

        return [
            (DescribeAclsRequest, 1, 3, self.describe_acls),
            (CreateAclsRequest, 1, 3, self.create_acls),
            (DeleteAclsRequest, 1, 3, self.delete_acls),
            (DescribeUserScramCredentialsRequest, 0, 0, self.describe_scram),
            (AlterUserScramCredentialsRequest, 0, 0, self.alter_scram),
        ]

    def _allowed(self, ctx: Any, operation: str) -> bool:
        return self.check is None or self.check(ctx, operation)

    async def _write(self, fn: Callable[[], int]) -> None:
        """Run a controller write off the loop, then wait for our image to have it."""
        loop = asyncio.get_running_loop()
        offset = await loop.run_in_executor(self.io, fn)
        await loop.run_in_executor(self.io, self.wait_for_offset, offset, METADATA_WAIT_S)

    # ------------------------------------------------------------ ACLs

    async def describe_acls(self, req: Any, ctx: Any) -> Any:
        R = response_class(29)[ctx.api_version]
        if not self._allowed(ctx, "DESCRIBE"):
            return R(
                throttle_time_ms=0,
                error_code=KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                error_message="not authorized to describe ACLs",
                resources=[],
            )
        flt = _wire_filter(req)
        groups: dict[tuple[str, str, str], list[AclBinding]] = {}
        for b in sorted(self.image_fn().acls.values(), key=lambda b: b.model_dump_json()):
            if filter_matches(b, flt):
                groups.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
        resources = [
            R.DescribeAclsResource(
                resource_type=code_of(RESOURCE_TYPES, rt),
                resource_name=name,
                pattern_type=code_of(PATTERN_TYPES, pt),
                acls=[
                    R.DescribeAclsResource.AclDescription(
                        principal=b.principal,
                        host=b.host,
                        operation=code_of(OPERATIONS, b.operation),
                        permission_type=code_of(PERMISSIONS, b.permission),
                    )
                    for b in bindings
                ],
            )
            for (rt, name, pt), bindings in groups.items()
        ]
        return R(throttle_time_ms=0, error_code=0, error_message=None, resources=resources)

    async def create_acls(self, req: Any, ctx: Any) -> Any:
        R = response_class(30)[ctx.api_version]
        Result = response_class(30).AclCreationResult
        creations = list(req.creations or [])
        if not self._allowed(ctx, "ALTER"):
            code = KafkaError.CLUSTER_AUTHORIZATION_FAILED
            return R(
                throttle_time_ms=0,
                results=[
                    Result(error_code=code, error_message="not authorized") for _ in creations
                ],
            )
        results: list[Any] = []
        bindings: list[AclBinding] = []
        for c in creations:
            try:
                binding = AclBinding(
                    resource_type=RESOURCE_TYPES.get(int(c.resource_type), "?"),
                    resource_name=c.resource_name,
                    pattern_type=PATTERN_TYPES.get(
                        int(getattr(c, "resource_pattern_type", 3)), "?"
                    ),
                    principal=c.principal,
                    host=c.host,
                    operation=OPERATIONS.get(int(c.operation), "?"),
                    permission=PERMISSIONS.get(int(c.permission_type), "?"),
                )
            except ValidationError as exc:
                message = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors()[:3])
                results.append(Result(error_code=KafkaError.INVALID_REQUEST, error_message=message))
                continue
            bindings.append(binding)
            results.append(Result(error_code=0, error_message=None))
        if bindings:
            try:
                await self._write(
                    lambda: self.controller.create_acls(CreateAclsRequest(bindings=bindings))
                )
            except ControllerError as exc:
                return R(
                    throttle_time_ms=0,
                    results=[
                        Result(error_code=KafkaError.UNKNOWN_SERVER_ERROR, error_message=str(exc))
                        for _ in creations
                    ],
                )
        return R(throttle_time_ms=0, results=results)

    async def delete_acls(self, req: Any, ctx: Any) -> Any:
        cls = response_class(31)
        R = cls[ctx.api_version]
        FilterResult = cls.DeleteAclsFilterResult
        filters = list(req.filters or [])
        if not self._allowed(ctx, "ALTER"):
            return R(
                throttle_time_ms=0,
                filter_results=[
                    FilterResult(
                        error_code=KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                        error_message="not authorized",
                        matching_acls=[],
                    )
                    for _ in filters
                ],
            )
        wanted = [_wire_filter(f) for f in filters]
        image = self.image_fn()
        # resolve MATCH filters against the image here: the controller deletes exact filters
        exact = [
            [AclFilter(**b.model_dump()) for b in image.acls.values() if filter_matches(b, f)]
            for f in wanted
        ]
        flat = [f for fs in exact for f in fs]
        if flat:
            try:
                result = await asyncio.get_running_loop().run_in_executor(
                    self.io, lambda: self.controller.delete_acls(DeleteAclsRequest(filters=flat))
                )
                await asyncio.get_running_loop().run_in_executor(
                    self.io, self.wait_for_offset, result.metadata_offset, METADATA_WAIT_S
                )
            except ControllerError as exc:
                return R(
                    throttle_time_ms=0,
                    filter_results=[
                        FilterResult(
                            error_code=KafkaError.UNKNOWN_SERVER_ERROR,
                            error_message=str(exc),
                            matching_acls=[],
                        )
                        for _ in filters
                    ],
                )
        Match = FilterResult.DeleteAclsMatchingAcl
        return R(
            throttle_time_ms=0,
            filter_results=[
                FilterResult(
                    error_code=0,
                    error_message=None,
                    matching_acls=[
                        Match(
                            error_code=0,
                            error_message=None,
                            resource_type=code_of(RESOURCE_TYPES, f.resource_type or ""),
                            resource_name=f.resource_name or "",
                            pattern_type=code_of(PATTERN_TYPES, f.pattern_type or ""),
                            principal=f.principal or "",
                            host=f.host or "",
                            operation=code_of(OPERATIONS, f.operation or ""),
                            permission_type=code_of(PERMISSIONS, f.permission or ""),
                        )
                        for f in fs
                    ],
                )
                for fs in exact
            ],
        )

    # ------------------------------------------------------------ SCRAM users

    async def describe_scram(self, req: Any, ctx: Any) -> Any:
        cls = response_class(50)
        R = cls[ctx.api_version]
        if not self._allowed(ctx, "DESCRIBE"):
            return R(
                throttle_time_ms=0,
                error_code=KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                error_message="not authorized to describe users",
                results=[],
            )
        creds = self.image_fn().scram_credentials.values()
        by_user: dict[str, list] = {}
        for c in creds:
            by_user.setdefault(c.user, []).append(c)
        wanted = [u.name for u in req.users] if req.users else sorted(by_user)
        Result = cls.DescribeUserScramCredentialsResult
        results = []
        for user in wanted:
            found = sorted(by_user.get(user, []), key=lambda c: c.mechanism)
            results.append(
                Result(
                    user=user,
                    error_code=0 if found else KafkaError.RESOURCE_NOT_FOUND,
                    error_message=None if found else f"no SCRAM credentials for {user}",
                    credential_infos=[
                        Result.CredentialInfo(
                            mechanism=1 if c.mechanism == "SCRAM-SHA-256" else 2,
                            iterations=c.iterations,
                        )
                        for c in found
                    ],
                )
            )
        return R(throttle_time_ms=0, error_code=0, error_message=None, results=results)

    async def alter_scram(self, req: Any, ctx: Any) -> Any:
        cls = response_class(51)
        R = cls[ctx.api_version]
        Result = cls.AlterUserScramCredentialsResult
        users = [d.name for d in req.deletions or []] + [u.name for u in req.upsertions or []]
        if not self._allowed(ctx, "ALTER"):
            code = KafkaError.CLUSTER_AUTHORIZATION_FAILED
            return R(
                throttle_time_ms=0,
                results=[
                    Result(user=u, error_code=code, error_message="not authorized") for u in users
                ],
            )
        errors: dict[str, tuple[int, str]] = {}
        upsertions, deletions = [], []
        for d in req.deletions or []:
            mechanism = SCRAM_MECHANISM_CODES.get(int(d.mechanism))
            if mechanism is None:
                errors[d.name] = (KafkaError.UNSUPPORTED_SASL_MECHANISM, "unknown mechanism")
            elif scram_key(mechanism, d.name) not in self.image_fn().scram_credentials:
                errors[d.name] = (KafkaError.RESOURCE_NOT_FOUND, f"no {mechanism} credential")
            else:
                deletions.append({"user": d.name, "mechanism": mechanism})
        for u in req.upsertions or []:
            mechanism = SCRAM_MECHANISM_CODES.get(int(u.mechanism))
            if mechanism is None:
                errors[u.name] = (KafkaError.UNSUPPORTED_SASL_MECHANISM, "unknown mechanism")
                continue
            if not MIN_ITERATIONS <= int(u.iterations) <= MAX_ITERATIONS:
                errors[u.name] = (
                    KafkaError.UNACCEPTABLE_CREDENTIAL,
                    f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}",
                )
                continue
            if not u.name or not u.salt or not u.salted_password:
                errors[u.name] = (
                    KafkaError.UNACCEPTABLE_CREDENTIAL,
                    "empty user, salt or password",
                )
                continue
            stored, server = keys_from_salted_password(mechanism, bytes(u.salted_password))
            upsertions.append(
                ScramUpsertion(
                    user=u.name,
                    mechanism=mechanism,  # type: ignore[arg-type]
                    salt=b64(bytes(u.salt)),
                    iterations=int(u.iterations),
                    stored_key=b64(stored),
                    server_key=b64(server),
                )
            )
        upsertions = [u for u in upsertions if u.user not in errors]
        deletions = [d for d in deletions if d["user"] not in errors]
        if upsertions or deletions:
            body = AlterScramCredentialsRequest(upsertions=upsertions, deletions=deletions)
            try:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    self.io, lambda: self.controller.alter_scram_credentials(body)
                )
                await loop.run_in_executor(
                    self.io, self.wait_for_offset, result.metadata_offset, METADATA_WAIT_S
                )
                for r in result.results:
                    if r.error:
                        errors.setdefault(r.user, (KafkaError.UNACCEPTABLE_CREDENTIAL, r.message))
            except ControllerError as exc:
                for u in users:
                    errors.setdefault(u, (KafkaError.UNKNOWN_SERVER_ERROR, str(exc)))
        log.info(
            "SCRAM credentials altered by %s: %d upserted, %d deleted, %d refused",
            ctx.extras.get("principal", "anonymous"),
            len(upsertions),
            len(deletions),
            len(errors),
        )
        return R(
            throttle_time_ms=0,
            results=[
                Result(
                    user=u,
                    error_code=errors.get(u, (0, ""))[0],
                    error_message=errors[u][1] if u in errors else None,
                )
                for u in dict.fromkeys(users)
            ],
        )
