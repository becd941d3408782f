"""The controller API's credential: one per-cluster secret sent as `Authorization: Bearer`.

`automqctl cluster up` generates the secret, keeps it in the cluster directory (mode 0600:
`cluster.json`, `quorum.json`, each broker's `broker.json` and `controller-api.secret`) and
never puts it on a command line. Clients that are not started by the CLI (Spark jobs, tools)
find it in the environment: `AUTOMQ_CONTROLLER_SECRET` (the secret itself) or
`AUTOMQ_CONTROLLER_SECRET_FILE` (a path to a file holding it).

A controller without a configured secret (in-process test quorums) serves without a
credential; `cluster up` always configures one.

Pure apart from reading the environment and the secret file.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

SECRET_ENV = "AUTOMQ_CONTROLLER_SECRET"
SECRET_FILE_ENV = "AUTOMQ_CONTROLLER_SECRET_FILE"
SECRET_FILE_NAME = "controller-api.secret"
MIN_SECRET_CHARS = 16


def generate_secret() -> str:
    """A fresh random secret (32 url-safe characters, 192 bits)."""
    return secrets.token_urlsafe(24)


def bearer_header(secret: str) -> dict[str, str]:
    """The HTTP header that carries `secret`."""
    return {"Authorization": f"Bearer {secret}"}


def is_authorized(authorization: str | None, secret: str | None) -> bool:
    """True if the `Authorization` header value proves `secret` (always true without a
    configured secret). Compared in constant time."""
    if secret is None:
        return True
    if not authorization or not authorization.startswith("Bearer "):
        return False
    return hmac.compare_digest(authorization[len("Bearer ") :].strip().encode(), secret.encode())


def read_secret_file(path: Path) -> str:
    """The secret in `path` (surrounding whitespace stripped); ValueError if it is too short."""
    secret = Path(path).read_text().strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise ValueError(f"{path} does not hold a controller API secret")
    return secret


def secret_from_env() -> str | None:
    """The secret from AUTOMQ_CONTROLLER_SECRET or AUTOMQ_CONTROLLER_SECRET_FILE, else None."""
    value = os.environ.get(SECRET_ENV, "").strip()
    if value:
        return value
    path = os.environ.get(SECRET_FILE_ENV, "").strip()
    if path:
        return read_secret_file(Path(path))
    return None
