"""The sim backend's YAML profile: simulated devices and injectable faults."""
