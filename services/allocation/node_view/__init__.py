"""This node's devices as the bus tells them: the inventory, device health, their watchers."""
