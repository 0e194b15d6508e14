"""The device-plugin front's view of the node's inventory: resources and their devices.

Reads the allocation agent's `InventoryCache` (the last good inventory, quarantine rules
included) and groups it with `deviceplugin.resources`; recomputed only when the cache holds a new
inventory, and then `changed()` fires if the resources differ (a device's NUMA node, say,
with its name unchanged, which the health board does not signal). No I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from services.allocation.deviceplugin import resources as dp_resources
from services.allocation.deviceplugin.resources import Resource
from services.allocation.node_view.inventory_cache import InventoryCache
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["DeviceCatalog"]


class DeviceCatalog:
    def __init__(
        self, cache: InventoryCache, *, driver: str, backend: str, overrides: Mapping[str, str]
    ) -> None:
        self.cache = cache
        self.driver = driver
        self.backend = backend
        """The node's own backend (`--backend`), never the inventory's."""
        self.overrides = dict(overrides)
        self._seen: inventory_pb2.Inventory | None = None
        self._resources: dict[str, Resource] = {}
        self._changed = asyncio.Event()

    def changed(self) -> asyncio.Event:
        """The event of the next change of the resources; take it before reading them."""
        return self._changed

    def resources(self) -> dict[str, Resource]:
        current = self.cache.current
        if current is not self._seen:
            resources = dp_resources.resources(
                current, driver=self.driver, backend=self.backend, overrides=self.overrides
            )
            self._seen = current
            if resources != self._resources:
                self._resources = resources
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
        return self._resources

    def resource(self, name: str) -> Resource:
        """The resource `name`, with no devices when the inventory offers none of it now."""
        return self.resources().get(name) or Resource(name=name, devices=())
