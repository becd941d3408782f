"""The zone router (seed 000): clients talk only to brokers of their own AZ.

`formats.client_az` tells a client's AZ; `proxy_mapping` gives every broker one proxy in each other
AZ; `routing` rewrites metadata and resolves partitions for a client's AZ; `proxy_partition`
serves a partition on a proxy; `channel` and `protocol` carry a proxy's produce to the main.
"""
