"""Device metadata in the container (KEP-5304): a DeviceMetadata file per request, read-only."""
