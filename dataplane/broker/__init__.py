"""The broker process, the composition root of the data plane (the top data-plane layer).

- `process.py`: `main` (arguments, signals, the re-exec of a process fenced for good);
- `assembly.py`: `Broker`, which builds every part with constructor injection, in
  dependency order, and starts the optional components only when configured or needed;
- `heartbeat.py`: registration, heartbeats, the stats they carry, bucket probes;
- `wal_failovers.py`: the WAL failovers this broker is the target of;
- `components.py`: the component protocol (`start`, `stop`, `on_metadata(delta, image)`);
- `listeners.py`: the Kafka listeners (SASL, TLS, ACLs) and the inter-broker login;
- `shard_store.py`: this broker's erasure shard store and its HTTP server;
- `metadata.py`: the metadata follower (replays the controllers' log, hands out deltas);
- `stall.py`: noticing that this process was stopped past its session.

Run: python -m dataplane.broker --config broker.json
"""
