"""The DRA front: the kubelet's DRAPlugin and health services, claims, prepare, checkpoints."""
