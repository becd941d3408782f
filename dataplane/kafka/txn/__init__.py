"""Kafka transactions (KIP-98, KIP-447) as Kafka 3.9 serves them.

* :mod:`.state` - pure transaction metadata and its transitions (no I/O);
* :mod:`.markers` - pure control batches (COMMIT/ABORT markers) and their parsing;
* :mod:`.coordinator` - :class:`TransactionCoordinator`: per transactional id state, kept
  durable in the controller's KV, markers written to every partition of a transaction,
  timeouts, recovery when a coordinator slot moves here;
* :mod:`.handlers` - :class:`TxnHandlers`: kafka-python requests in, responses out.
"""
