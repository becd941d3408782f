"""Security metadata: SCRAM credentials and ACLs, as the controller stores them.

Pure: the SCRAM credential derivation (RFC 5802 / RFC 7677: the controller only ever sees
salted hashes) and the command handlers (image, request) -> (records, response), no I/O.
The SASL exchange itself is in dataplane/kafka/security/; the ACL evaluation in
dataplane/kafka/security/authorizer.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Literal

from controlplane import records as r
from controlplane.image import MetadataImage
from controlplane.requests import (
    AclFilter,
    AlterScramCredentialsRequest,
    AlterScramCredentialsResponse,
    CreateAclsRequest,
    DeleteAclsRequest,
    DeleteAclsResponse,
    ScramAlterResult,
    ScramUpsertion,
)

ScramMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]
SCRAM_HASHES: dict[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
DEFAULT_SCRAM_ITERATIONS = 4096  # Kafka's default and minimum
SALT_BYTES = 32


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)


def scram_key(mechanism: str, user: str) -> str:
    """The image key of a user's credential for one mechanism."""
    return f"{mechanism}:{user}"


def acl_key(binding: r.AclBinding) -> str:
    """The image key of an ACL: its canonical JSON."""
    return binding.model_dump_json()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i) of RFC 5802 (PBKDF2-HMAC; SASLprep is the identity
    for the ASCII passwords Kafka's tools produce)."""
    return hashlib.pbkdf2_hmac(SCRAM_HASHES[mechanism], password.encode(), salt, iterations)


def keys_from_salted_password(mechanism: str, salted: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) from a SaltedPassword (RFC 5802 section 3)."""
    name = SCRAM_HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", name).digest()
    return stored_key, server_key


def scram_upsertion(
    user: str,
    mechanism: str,
    password: str,
    iterations: int = DEFAULT_SCRAM_ITERATIONS,
    salt: bytes | None = None,
) -> ScramUpsertion:
    """The credential to store for `password` (a fresh random salt unless given)."""
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    stored, server = keys_from_salted_password(
        mechanism, salted_password(mechanism, password, salt, iterations)
    )
    return ScramUpsertion(
        user=user,
        mechanism=mechanism,  # type: ignore[arg-type]
        salt=b64(salt),
        iterations=iterations,
        stored_key=b64(stored),
        server_key=b64(server),
    )


def alter_scram_credentials(
    image: MetadataImage, req: AlterScramCredentialsRequest, now_ms: int
) -> tuple[list, AlterScramCredentialsResponse]:
    """Upsert and delete credentials; a deletion of a credential that does not exist is a
    per-user RESOURCE_NOT_FOUND (Kafka's answer), the others still apply."""
    records: list = []
    results: list[ScramAlterResult] = []
    touched: set[tuple[str, str]] = set()
    for d in req.deletions:
        if (d.user, d.mechanism) in touched:
            results.append(
                ScramAlterResult(
                    user=d.user,
                    mechanism=d.mechanism,
                    error="DUPLICATE_RESOURCE",
                    message="a user and mechanism appear twice",
                )
            )
            continue
        touched.add((d.user, d.mechanism))
        if scram_key(d.mechanism, d.user) not in image.scram_credentials:
            results.append(
                ScramAlterResult(
                    user=d.user,
                    mechanism=d.mechanism,
                    error="RESOURCE_NOT_FOUND",
                    message=f"no {d.mechanism} credential for {d.user}",
                )
            )
            continue
        records.append(r.RemoveScramCredentialRecord(user=d.user, mechanism=d.mechanism))
        results.append(ScramAlterResult(user=d.user, mechanism=d.mechanism))
    for u in req.upsertions:
        if (u.user, u.mechanism) in touched:
            results.append(
                ScramAlterResult(
                    user=u.user,
                    mechanism=u.mechanism,
                    error="DUPLICATE_RESOURCE",
                    message="a user and mechanism appear twice",
                )
            )
            continue
        touched.add((u.user, u.mechanism))
        try:
            for field in (u.salt, u.stored_key, u.server_key):
                unb64(field)
        except ValueError:
            results.append(
                ScramAlterResult(
                    user=u.user,
                    mechanism=u.mechanism,
                    error="INVALID_REQUEST",
                    message="salt and keys must be base64",
                )
            )
            continue
        records.append(r.ScramCredentialRecord(**u.model_dump()))
        results.append(ScramAlterResult(user=u.user, mechanism=u.mechanism))
    return records, AlterScramCredentialsResponse(
        results=results, metadata_offset=image.offset + len(records)
    )


def create_acls(image: MetadataImage, req: CreateAclsRequest, now_ms: int) -> tuple[list, dict]:
    """Add ACLs (one already present is not logged again)."""
    new = {acl_key(b): b for b in req.bindings if acl_key(b) not in image.acls}
    return [r.AclRecord(binding=b) for b in new.values()], {
        "created": len(new),
        "metadata_offset": image.offset + len(new),
    }


def acl_matches(binding: r.AclBinding, flt: AclFilter) -> bool:
    """True if the filter (None = any) selects the binding exactly (Kafka's ANY filter)."""
    for name, wanted in flt.model_dump().items():
        if wanted is None or wanted == "ANY":
            continue
        have = getattr(binding, name)
        if name in ("resource_name", "principal", "host"):
            if have != wanted:
                return False
        elif have != str(wanted).upper():
            return False
    return True


def delete_acls(
    image: MetadataImage, req: DeleteAclsRequest, now_ms: int
) -> tuple[list, DeleteAclsResponse]:
    """Delete every ACL a filter matches; per filter, the ACLs it deleted."""
    deleted: set[str] = set()
    matches: list[list[r.AclBinding]] = []
    for flt in req.filters:
        found = [b for k, b in sorted(image.acls.items()) if acl_matches(b, flt)]
        matches.append(found)
        deleted.update(acl_key(b) for b in found)
    records = [r.AclRecord(binding=image.acls[k], removed=True) for k in sorted(deleted)]
    return records, DeleteAclsResponse(matches=matches, metadata_offset=image.offset + len(records))
