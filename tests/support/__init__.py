"""Test support shared by the e2e tests and the benchmarks: `cluster` (a running cluster,
fixtures, topic helpers), `ledger` (the acked-write ledger) and `faults` (the failure
injector: kill, terminate, suspend, object-store pause and errors, disk full, WAL
corruption, all healed on exit)."""
