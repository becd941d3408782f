"""Moved to tests/support (cluster.py, ledger.py); kept so older imports keep working."""

from tests.support.cluster import (  # noqa: F401
    automqctl,
    cluster_status,
    create_topic,
    leaders,
    running_cluster,
)
from tests.support.ledger import Ack, AckLedger, LedgerReport  # noqa: F401
