"""Kafka's JSON message definitions (copied from apache/kafka
clients/src/main/resources/common/message) of the KIP-848 group APIs kafka-python does not
ship: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69)."""
