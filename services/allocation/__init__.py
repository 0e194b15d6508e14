"""The allocation agent: the kubelet plugin gRPC front (registration, DRA, health stream)."""
