"""Leaderless erasure-coded partitions (issue #14, seed 004): a first slice.

A record batch is Reed-Solomon coded into k data + m parity shards; shard i of an offset is
written to hole i, kept by shard store i. A write wins an offset when k holes hold its shards;
readers decide offsets below a visible end after filling the empty holes (write-once), so a
late shard can never make an offset appear after a reader passed it.

Modules: codec (zfec), shard_format (bytes on the wire and on disk), holes (the pure rules),
store (durable write-once holes on local disk), store_server / store_client (the network
service on each broker), writer (the embedded writer SDK), reader.
"""
