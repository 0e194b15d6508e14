"""What both kubelet fronts share: socket files, one gRPC server per socket, request guards."""
