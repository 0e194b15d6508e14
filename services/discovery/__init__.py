"""Discovery agent: enumerates devices, publishes the node inventory and its ResourceSlices."""
