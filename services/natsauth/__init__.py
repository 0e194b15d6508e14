"""dra-nats-auth: the NATS auth callout that turns ServiceAccount tokens into bus identities."""
