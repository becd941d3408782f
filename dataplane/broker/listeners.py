"""The broker's Kafka listeners (one socket each, Kafka's `listeners`) with their SASL, TLS
and ACL enforcement, and the inter-broker login that follows the listener brokers talk to
each other on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane.calls import ControllerCalls
from controlplane.image import MetadataImage
from controlplane.listeners import SASL_PROTOCOLS, TLS_PROTOCOLS, listeners_error
from dataplane.config import BrokerConfig
from dataplane.kafka.interbroker import InterBrokerLogin
from dataplane.kafka.registry import ApiRegistry
from dataplane.kafka.security.admin_apis import SecurityAdminApis
from dataplane.kafka.server import ServerListener

log = logging.getLogger(__name__)

ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"  # Kafka's principal of unauthenticated listeners


def inter_broker_login(cfg: BrokerConfig) -> InterBrokerLogin:
    """The `InterBrokerLogin` of a broker of `cfg`: it follows the listener brokers talk to
    each other on, their first (registered as host:kafka_port): the broker principal's SASL
    login on SASL_*, the cluster CA and this broker's client certificate (mutual TLS) on
    *SSL. Warns when the config lacks what that listener needs."""
    protocol = cfg.effective_listeners()[0].security_protocol
    if protocol in SASL_PROTOCOLS and not cfg.inter_broker_sasl_username:
        log.warning(
            "SASL listener without an inter-broker login (inter_broker_sasl_username): "
            "other brokers will refuse this one's requests"
        )
    if protocol in TLS_PROTOCOLS and cfg.tls_ca_file is None:
        log.warning("TLS listener without tls_ca_file: requests to other brokers will fail")
    if protocol == "SSL" and cfg.ssl_client_auth == "required" and not cfg.tls_client_cert_file:
        log.warning(
            "ssl_client_auth=required without tls_client_cert_file: other brokers will "
            "refuse this one's requests"
        )
    return InterBrokerLogin.for_listener(
        protocol,
        sasl_username=cfg.inter_broker_sasl_username,
        sasl_password=cfg.inter_broker_sasl_password,
        sasl_mechanism=cfg.inter_broker_sasl_mechanism,
        ssl_ca_file=cfg.tls_ca_file,
        ssl_cert_file=cfg.tls_client_cert_file,
        ssl_key_file=cfg.tls_client_key_file,
    )


def tls_context(cfg: BrokerConfig, client_auth: str = "none"):
    """A listener's TLS context when a certificate is configured, else None;
    `client_auth` (ssl.client.auth) asks clients for a certificate of tls_ca_file."""
    if cfg.tls_cert_file is None or cfg.tls_key_file is None:
        return None
    from dataplane.kafka.security.tls import server_ssl_context

    return server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file, client_auth, cfg.tls_ca_file)


def check_listeners(cfg: BrokerConfig) -> None:
    """Refuse invalid listeners, and an unauthenticated one on a non-loopback address
    unless `allow_insecure` (RuntimeError naming the flag). Called before the broker
    registers, so a config error claims no node epoch and no WAL."""
    refused = listeners_error(
        cfg.effective_listeners(),
        sasl_enabled=cfg.sasl_enabled,
        tls_configured=cfg.tls_cert_file is not None and cfg.tls_key_file is not None,
        allow_insecure=cfg.allow_insecure,
        ssl_client_auth=cfg.ssl_client_auth == "required",
    )
    if refused:
        raise RuntimeError(refused)
    if cfg.ssl_client_auth != "none" and cfg.tls_ca_file is None:
        raise RuntimeError("ssl_client_auth needs tls_ca_file (the CA of client certificates)")


def secure_listeners(
    cfg: BrokerConfig,
    registry: ApiRegistry,
    controller: ControllerCalls,
    image_fn: Callable[[], MetadataImage],
    wait_for_offset: Callable[[int, float], bool],
) -> list[ServerListener]:
    """The server's listeners: SASL and the security admin APIs registered in `registry`
    when configured, ACLs enforced on every listener of a SASL cluster (a PLAINTEXT or SSL
    listener's clients are User:ANONYMOUS, as in Kafka)."""
    check_listeners(cfg)
    enforcer = None
    if cfg.acls_enforced:
        from dataplane.kafka.security.authorizer import Authorizer
        from dataplane.kafka.security.enforcement import AclEnforcer

        enforcer = AclEnforcer(Authorizer(cfg.super_users), image_fn)
    admin = SecurityAdminApis(
        controller,
        image_fn,
        wait_for_offset,
        enforcer.allowed_cluster if enforcer is not None else None,
    )
    for request_class, lo, hi, handler in admin.registrations():
        registry.register(request_class, lo, hi, handler)
    sasl = None
    if cfg.sasl_enabled:
        from dataplane.kafka.security.sasl import SaslAuthenticator

        sasl = SaslAuthenticator(image_fn)
        for request_class, lo, hi, handler in sasl.registrations():
            registry.register(request_class, lo, hi, handler)
        log.info("SASL mechanisms: %s", ", ".join(sasl.mechanisms))
    if enforcer is not None:
        enforcer.install(registry)  # after every registration: nothing stays unchecked
        log.info("ACLs enforced; super users: %s", ", ".join(cfg.super_users) or "none")
    return [_listener(cfg, e, sasl, enforcer is not None) for e in cfg.effective_listeners()]


def _listener(cfg: BrokerConfig, endpoint, sasl, acls_enforced: bool) -> ServerListener:
    """One endpoint's listener: SSL listeners ask for client certificates when
    ssl_client_auth says so (their CN is the principal); SASL_SSL ones take the principal
    from the SASL login."""
    from dataplane.kafka.security.tls import principal_of_certificate

    protocol = endpoint.security_protocol
    extras: dict = {"security_protocol": protocol}
    admit = None
    if protocol in SASL_PROTOCOLS:
        assert sasl is not None  # listeners_error refuses SASL without sasl_enabled
        admit = sasl.admit
    elif acls_enforced:
        extras["principal"] = ANONYMOUS_PRINCIPAL
    ssl_context = None
    if protocol == "SSL":
        ssl_context = tls_context(cfg, cfg.ssl_client_auth)
    elif protocol == "SASL_SSL":
        ssl_context = tls_context(cfg)
    log.info("listener %s: %s on %s:%d", endpoint.name, protocol, endpoint.host, endpoint.port)
    return ServerListener(
        host=endpoint.host,
        port=endpoint.port,
        name=endpoint.name,
        ssl_context=ssl_context,
        admit=admit,
        extras=extras,
        principal_of_peer=(
            principal_of_certificate
            if protocol == "SSL" and cfg.ssl_client_auth != "none"
            else None
        ),
    )
