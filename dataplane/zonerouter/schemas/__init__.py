"""JSON message definitions of the zone router's broker-to-broker API (Kafka's format)."""
