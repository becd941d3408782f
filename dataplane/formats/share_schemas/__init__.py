"""JSON message definitions of the KIP-932 share-group APIs (Kafka's format; version 1, the
first stable version, which librdkafka 2.16 requests). kafka-python 3.0 has no schemas for
them."""
