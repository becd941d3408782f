"""Per-bucket S3 credentials from a private secrets file (`cluster up --bucket-secrets-file`).

The file holds `NAME=VALUE` lines (blank lines and `#` comments ignored), with the same names
as the per-bucket environment variables::

    AUTOMQ_S3_ACCESS_KEY_0=...
    AUTOMQ_S3_SECRET_KEY_0=...
    AUTOMQ_S3_ACCESS_KEY_1=...
    AUTOMQ_S3_SECRET_KEY_1=...

It must be a regular file readable by its owner only (mode 0600 or 0400): a file that group or
others may read is refused, since the keys in it would already be exposed. Errors name the
file, the line number and the variable, never a value.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

MAX_SECRETS_FILE_BYTES = 64 * 1024
_NAME_RE = re.compile(r"^AUTOMQ_S3_(ACCESS|SECRET)_KEY_([0-9]{1,5})$")


class BucketSecretsError(ValueError):
    """The secrets file is missing, too open, or malformed (the message holds no secret)."""


def load_bucket_secrets(path: Path) -> dict[int, tuple[str, str]]:
    """bucket id -> (access key, secret key) from the secrets file at `path`.

    Raises BucketSecretsError when the file cannot be read, is readable by group or others,
    is larger than MAX_SECRETS_FILE_BYTES, has a line that is not `NAME=VALUE` with a known
    name, names a variable twice, or gives a bucket only one of its two keys.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise BucketSecretsError(
            f"cannot read the bucket secrets file {path}: {exc.strerror}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BucketSecretsError(f"the bucket secrets file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise BucketSecretsError(
                f"the bucket secrets file {path} is readable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {path}`"
            )
        data = os.read(fd, MAX_SECRETS_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRETS_FILE_BYTES:
        raise BucketSecretsError(
            f"the bucket secrets file {path} is larger than {MAX_SECRETS_FILE_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BucketSecretsError(f"the bucket secrets file {path} is not UTF-8 text") from None
    keys: dict[int, dict[str, str]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not sep:  # shown by number only: such a line may be a pasted secret
            raise BucketSecretsError(f"{path} line {number}: expected NAME=VALUE")
        match = _NAME_RE.match(name)
        if not match:
            raise BucketSecretsError(
                f"{path} line {number}: unknown name {name[:60]!r}; expected "
                "AUTOMQ_S3_ACCESS_KEY_<id> or AUTOMQ_S3_SECRET_KEY_<id>"
            )
        kind, bucket_id = match.group(1).lower(), int(match.group(2))
        if not value:
            raise BucketSecretsError(f"{path} line {number}: {name} is empty")
        if kind in keys.setdefault(bucket_id, {}):
            raise BucketSecretsError(f"{path} line {number}: {name} is given more than once")
        keys[bucket_id][kind] = value
    out: dict[int, tuple[str, str]] = {}
    for bucket_id, pair in sorted(keys.items()):
        if set(pair) != {"access", "secret"}:
            missing = "SECRET" if "access" in pair else "ACCESS"
            raise BucketSecretsError(
                f"{path}: bucket {bucket_id} needs AUTOMQ_S3_{missing}_KEY_{bucket_id} too"
            )
        out[bucket_id] = (pair["access"], pair["secret"])
    return out
