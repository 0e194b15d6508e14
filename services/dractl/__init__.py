"""dractl: the operator's command line over the agents' NATS state (inventory, health, faults)."""
