"""NATS wiring: connection, subject and bucket names, KV helpers, message codec."""
