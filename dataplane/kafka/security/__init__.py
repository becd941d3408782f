"""Kafka listener security: SASL mechanisms (PLAIN, SCRAM), per-connection authentication
and the ACL authorizer. The mechanisms and the authorizer are pure; `sasl.py` wires them to
the API registry and the server's admission gate."""
