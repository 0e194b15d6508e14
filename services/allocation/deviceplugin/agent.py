"""The allocation agent in device-plugin mode (`--kubelet-api device-plugin`): wiring only.

The same inventory and health watchers as the DRA front feed a `DevicePluginFront` instead of
the DRA servers; no Kubernetes client (the kubelet's device manager owns allocations). Order:
refuse to start while the DRA front of this driver serves on the node, recover the inventory
copy, connect the bus, then serve and register. Shutdown runs in reverse: the servers stop
(their sockets go, so the kubelet sees the plugin leave), the board ends ListAndWatch streams,
NATS drains. Ready while every offered resource is registered with the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin import instruments
from services.allocation.deviceplugin.catalog import DeviceCatalog
from services.allocation.deviceplugin.front import DevicePluginFront
from services.allocation.kubelet import front_guard
from services.allocation.node_view import watchers
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from shared import atomicfile, opsserver
from shared.bus.connection import Bus
from shared.errors import ConfigError
from shared.supervisor import eternal

__all__ = ["DevicePluginAgent"]

log = structlog.get_logger(__name__)


class DevicePluginAgent:
    def __init__(self, config: AllocationConfig) -> None:
        self.config = config
        self.ready = asyncio.Event()
        driver, node = config.driver_name, config.node_name
        self.board = HealthBoard(pool=config.pool_name)
        self.inventory = InventoryCache(
            config.inventory_path, driver=driver, node=node, backend=config.backend
        )
        self.catalog = DeviceCatalog(
            self.inventory,
            driver=driver,
            backend=config.backend,
            overrides=config.device_plugin_overrides,
        )
        self.front = DevicePluginFront(
            catalog=self.catalog,
            board=self.board,
            plugin_dir=config.device_plugin_dir,
            cdi_root=config.cdi_root,
        )
        self.bus = Bus(config.nats, name=f"dra-allocation-{node}")

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        config = self.config
        if (reason := await front_guard.dra_front(config.registration_socket_path)) is not None:
            raise ConfigError(reason, field="kubelet_api")
        atomicfile.make_dirs(config.data_dir, mode=0o750)
        self.inventory.load()
        self.board.set_devices(self.inventory.device_names())
        resources.push_async_callback(self.bus.close)
        resources.push_async_callback(self.front.close)
        # Closed first: ListAndWatch streams end before their servers stop.
        resources.callback(self.board.close)
        await self.front.sync()
        instruments.observe_front(self.front.device_counts, self.front.stream_counts)
        await opsserver.open_ops_server(
            config.ops,
            resources,
            ready=self.ready,
            liveness={"sockets": self._sockets_present},
            readiness={"registration": self._not_registered},
        )
        log.info("device_plugin_serving", plugin_dir=str(config.device_plugin_dir))

    async def _sockets_present(self) -> str | None:
        """Every socket served must exist: the kubelet dials them by path."""
        for path in self.front.socket_paths():
            if not await asyncio.to_thread(path.is_socket):
                return f"{path} is gone"
        return None

    async def _not_registered(self) -> str | None:
        if self.inventory.current is None:
            return "no inventory of this node yet"
        missing = sorted(set(self.catalog.resources()) - self.front.registered)
        return f"not registered with the kubelet: {', '.join(missing)}" if missing else None

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        driver, node = self.config.driver_name, self.config.node_name
        tasks = {
            **watchers.node_view_tasks(
                self.bus, cache=self.inventory, board=self.board, driver=driver, node=node
            ),
            "device-plugin-front": self.front.run(),
        }
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)
