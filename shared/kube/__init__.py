"""kubernetes-asyncio wiring: client factory, resource types, error mapping, list+watch."""
