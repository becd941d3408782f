"""The formats floor: pure byte formats every layer above may share (no I/O, no threads).

Modules: record_batch (Kafka record batch v2 header validation and patching), kafka_errors
(the Kafka protocol's error table), stream_records (the `StreamRecordBatch` codec),
object_format (stream objects: data blocks + index + footer), seal_format (an erasure-coded
partition's seal: Kafka offsets as stream slots), link_record (the zone router's Link Record
payload), client_az (a client's AZ from its `client.id` or a CIDR map). A formats module imports only other formats modules.
"""
