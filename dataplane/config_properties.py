"""Java `.properties` files as Kafka's and AutoMQ's start scripts read them (pure but for
`read_properties_file`), and the value forms their keys use: sizes (`2GB`, `14G`), AutoMQ's
per-bucket lists (`main-endpoint,1@xxx-endpoint`) and `--override key=value`.

Syntax (java.util.Properties.load): a logical line may continue over several lines, each
ending with an odd number of backslashes (the next line's leading blanks are dropped); a
line whose first non-blank character is `#` or `!` is a comment; the key runs to the first
unescaped `=`, `:` or blank, then blanks and one `=` or `:` are skipped and the rest is the
value. Escapes: `\\t \\n \\r \\f`, `\\uXXXX`, and a backslash before any other character
stands for that character. Unlike Java, a key given twice with different values is refused
(a file that says two things is a mistake; `--override` is how a value is replaced).

The mapping of these keys onto this broker's settings is `dataplane.config_mapping`.
Layer: beside `dataplane.config`.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_PROPERTIES_BYTES = 1024 * 1024  # a server.properties is a few KiB
MAX_PROPERTIES_KEYS = 10_000
MAX_KEY_CHARS = 255
MAX_VALUE_CHARS = 64 * 1024
MAX_SIZE_BYTES = 1 << 50  # 1 PiB: larger is a typo
MAX_ID_PARTS = 256  # `N@` parts of one per-bucket value (= the bucket limit)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$")
_ID_PART = re.compile(r"^([0-9]{1,5})@(.*)$", re.DOTALL)
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_TRUE_FALSE = {"true": True, "false": False}


class PropertiesError(ValueError):
    """A properties file or value that cannot be used: the message names the key (or the
    line) and says why, in one line."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) of every non-blank, non-comment line."""
    out: list[tuple[int, str]] = []
    pending: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip(" \t\f")
        if pending is None:
            if not line or line[0] in "#!":
                continue
            start = number
            pending = ""
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line continues
            pending += line[:-1]
            continue
        out.append((start, pending + line))
        pending = None
    if pending is not None:  # a continuation at the end of the file
        out.append((start, pending))
    return out


def _unescape(text: str, where: str) -> str:
    """`text` with the .properties escapes replaced."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise PropertiesError(f"{where}: malformed \\uXXXX escape")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_key(line: str) -> tuple[str, str]:
    """(raw key, raw value) of one logical line (escapes still in place)."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """The keys and values of a .properties text, in file order (PropertiesError names the
    line of a malformed entry, or a key given twice with different values)."""
    if len(text) > MAX_PROPERTIES_BYTES:
        raise PropertiesError(f"{source} is larger than {MAX_PROPERTIES_BYTES} bytes")
    props: dict[str, str] = {}
    for number, line in _logical_lines(text):
        where = f"{source} line {number}"
        raw_key, raw_value = _split_key(line)
        key = _unescape(raw_key, where)
        value = _unescape(raw_value, where)
        if not key:
            raise PropertiesError(f"{where}: an entry without a key")
        if len(key) > MAX_KEY_CHARS:
            raise PropertiesError(f"{where}: a key longer than {MAX_KEY_CHARS} characters")
        if len(value) > MAX_VALUE_CHARS:
            raise PropertiesError(f"{key}: longer than {MAX_VALUE_CHARS} characters ({where})")
        if key in props and props[key] != value:
            raise PropertiesError(
                f"{key}: given twice with different values ({where}); keep one, or replace "
                "it with --override"
            )
        props[key] = value
        if len(props) > MAX_PROPERTIES_KEYS:
            raise PropertiesError(f"{source}: more than {MAX_PROPERTIES_KEYS} keys")
    return props


def parse_overrides(items: list[str]) -> dict[str, str]:
    """`--override key=value` arguments (AutoMQ's kafka-server-start.sh form) as a dict; a
    later override of a key wins, as there."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PropertiesError(f"--override {item[:80]!r}: want key=value")
        if len(key) > MAX_KEY_CHARS or len(value) > MAX_VALUE_CHARS:
            raise PropertiesError(f"{key[:80]}: --override key or value too long")
        out[key] = value
    return out


def read_properties_file(path: Path) -> dict[str, str]:
    """A properties file's keys and values (PropertiesError when it is missing, too large,
    not UTF-8 or Latin-1, or malformed)."""
    try:
        size = path.stat().st_size
        if size > MAX_PROPERTIES_BYTES:
            raise PropertiesError(f"{path} is larger than {MAX_PROPERTIES_BYTES} bytes")
        data = path.read_bytes()
    except OSError as exc:
        raise PropertiesError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # Java's own encoding of .properties files
    return parse_properties(text, str(path))


def file_is_private(path: Path) -> bool:
    """Whether only its owner may read `path` (no group or other permission bits)."""
    try:
        return path.stat().st_mode & 0o077 == 0
    except OSError:
        return False


def parse_size(key: str, value: str) -> int:
    """A size in bytes: a plain number, or one with a binary unit (`2GB`, `14G`, `512MiB`,
    `64k`; GB = GiB = 2^30, as the JVM's -Xmx and AutoMQ's docs use them)."""
    match = _SIZE.match(value.strip())
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise PropertiesError(
            f"{key}: {value.strip()[:40]!r} is not a size (bytes, or with a unit: 14G, 2GB, 512MiB)"
        )
    number = float(match.group(1)) if "." in match.group(1) else int(match.group(1))
    size = int(number * _UNITS[unit])
    if size > MAX_SIZE_BYTES:
        raise PropertiesError(f"{key}: {value.strip()[:40]} is larger than 1 PiB")
    return size


def parse_int(key: str, value: str, minimum: int | None = None) -> int:
    """An integer value (Kafka's INT/LONG keys)."""
    try:
        number = int(value.strip())
    except ValueError:
        raise PropertiesError(f"{key}: {value.strip()[:40]!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise PropertiesError(f"{key}: {number} is below {minimum}")
    return number


def parse_bool(key: str, value: str) -> bool:
    """A boolean value (`true` / `false`, any case, as Kafka's ConfigDef takes them)."""
    lowered = value.strip().lower()
    if lowered not in _TRUE_FALSE:
        raise PropertiesError(f"{key}: {value.strip()[:40]!r} is not true or false")
    return _TRUE_FALSE[lowered]


def parse_id_parts(key: str, value: str) -> dict[int, str]:
    """AutoMQ's per-bucket value (`main-endpoint,1@xxx-endpoint`): bucket id -> part; a part
    without `N@` belongs to bucket 0 (the main bucket)."""
    parts = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in parts):
        raise PropertiesError(f"{key}: an empty part (want main,1@failover)")
    if len(parts) > MAX_ID_PARTS:
        raise PropertiesError(f"{key}: more than {MAX_ID_PARTS} parts")
    out: dict[int, str] = {}
    for part in parts:
        match = _ID_PART.match(part)
        bucket_id, text = (int(match.group(1)), match.group(2).strip()) if match else (0, part)
        if not text:
            raise PropertiesError(f"{key}: bucket {bucket_id}'s part is empty")
        if bucket_id in out:
            raise PropertiesError(f"{key}: bucket {bucket_id} is given twice")
        out[bucket_id] = text
    return out
