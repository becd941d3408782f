"""Kafka client helpers for the CLI: a fast reachability check, quiet librdkafka, and error
text an operator can read (no request reprs, never empty)."""

from __future__ import annotations

import logging
import re
import socket
import time

# librdkafka logs every failed connection attempt; the CLI reports one line instead
_QUIET = logging.getLogger("automqctl.librdkafka")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
_QUIET.setLevel(logging.CRITICAL + 1)

QUIET_RDKAFKA = {"logger": _QUIET, "log.connection.close": False}

_ERROR_MESSAGE = re.compile(r"error_message=(?:'([^']*)'|\"([^\"]*)\")")


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad bootstrap server {item!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no bootstrap server given")
    return out


def check_reachable(bootstrap: str, timeout_s: float = 5.0) -> None:
    """Raise ConnectionError (one line) unless at least one bootstrap server accepts a TCP
    connection within `timeout_s` overall. A dead address fails in milliseconds to seconds
    instead of after a client's 30-60 s of retries."""
    addresses = _addresses(bootstrap)
    deadline = time.monotonic() + timeout_s
    errors = []
    for host, port in addresses:
        left = max(0.2, deadline - time.monotonic())
        try:
            with socket.create_connection((host, port), timeout=min(left, timeout_s)):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    raise ConnectionError(f"cannot reach Kafka at {bootstrap} ({'; '.join(errors)})")


def client_error_text(exc: BaseException) -> str:
    """One readable line for an exception of kafka-python or confluent-kafka."""
    # kafka-python: BrokerResponseError("Request 'CreateTopicsRequest(...)' failed with
    # response '...error_message='why'...'"): keep the code name and the broker's message
    errno = getattr(exc, "errno", None)
    name = getattr(exc, "message", None)
    if errno is not None and isinstance(name, str):
        m = _ERROR_MESSAGE.search(str(exc))
        why = (m.group(1) or m.group(2)) if m else ""
        return f"{name}: {why or getattr(exc, 'description', '') or type(exc).__name__}"
    # confluent-kafka: KafkaException(KafkaError) whose str() can be empty
    arg = exc.args[0] if getattr(exc, "args", None) else None
    if arg is not None and hasattr(arg, "str") and hasattr(arg, "name"):
        try:
            text = arg.str() or ""
            return f"{arg.name()}: {text}" if text else arg.name()
        except Exception:  # a foreign object with those names
            pass
    text = str(exc).strip()
    if len(text) > 300:
        text = text[:300] + " ..."
    name = type(exc).__name__
    if not text or text == name:
        return name
    return text if text.startswith(name) else f"{name}: {text}"  # kafka-python adds it itself


# a `LocalCluster.client_security()` key -> (its kafka-python/aiokafka setting, its
# confluent-kafka/librdkafka setting)
_SECURITY_SETTINGS = {
    "security_protocol": ("security_protocol", "security.protocol"),
    "mechanism": ("sasl_mechanism", "sasl.mechanism"),
    "username": ("sasl_plain_username", "sasl.username"),
    "password": ("sasl_plain_password", "sasl.password"),
    "ssl_ca_file": ("ssl_cafile", "ssl.ca.location"),
    "ssl_cert_file": ("ssl_certfile", "ssl.certificate.location"),
    "ssl_key_file": ("ssl_keyfile", "ssl.key.location"),
}


def _client_security(credentials: dict | None, client: int) -> dict:
    """The settings of `credentials` (a SASL login and/or the TLS CA, and the client
    certificate for mutual TLS) under one client library's names (`client`: the index in
    _SECURITY_SETTINGS' pairs); empty for PLAINTEXT."""
    if not credentials:
        return {}
    given = {"security_protocol": credentials.get("security_protocol", "SASL_PLAINTEXT")}
    names = ["mechanism", "username", "password"] if "username" in credentials else []
    if credentials.get("ssl_ca_file"):
        names.append("ssl_ca_file")
    if credentials.get("ssl_cert_file"):  # mutual TLS: the client certificate
        names += ["ssl_cert_file", "ssl_key_file"]
    given.update({name: credentials[name] for name in names})
    return {_SECURITY_SETTINGS[key][client]: value for key, value in given.items()}


def kafka_python_security(credentials: dict | None) -> dict:
    """kafka-python/aiokafka settings from `LocalCluster.client_security()` (a SASL login
    and/or the TLS CA); empty for a PLAINTEXT cluster."""
    return _client_security(credentials, 0)


def librdkafka_security(credentials: dict | None) -> dict:
    """confluent-kafka (librdkafka) settings from `LocalCluster.client_security()`; empty
    for PLAINTEXT."""
    return _client_security(credentials, 1)
