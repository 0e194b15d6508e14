"""The discovery agent: wiring of the backend, scanner, inventory publisher and slice reconciler.

No domain logic here. Tasks: `bus-connector`, `device-watcher`, `device-scanner`,
`inventory-publisher`, `slice-reconciler`, `scan-reporter` (Events on failed scans), and with
`--publish-device-taints` `taint-watcher` (the health KV). `published` (first successful slice
sync) is the readiness signal; `ready` is set by the supervisor once the tasks are started.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from services.discovery import backends, events, inventory, taints
from services.discovery.config import DiscoveryConfig
from services.discovery.publisher import InventoryPublisher
from services.discovery.reconciler import SliceReconciler
from services.discovery.scanner import DeviceScanner
from services.discovery.scanreport import ScanReporter
from shared import opsserver
from shared.bus.connection import Bus
from shared.errors import ProgrammingError
from shared.kube.client import KubeClient
from shared.supervisor import eternal

__all__ = ["DiscoveryAgent"]

log = structlog.get_logger(__name__)


class DiscoveryAgent:
    """Implements `shared.supervisor.Agent`."""

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        backend: backends.DeviceBackend | None = None,
        seams: backends.BackendSeams | None = None,
    ) -> None:
        """`backend` replaces the configured one; `seams` only its hardware interface."""
        self.config = config
        self.seams = seams
        self.ready = asyncio.Event()
        self.published = asyncio.Event()
        self.backend = backend
        self._bus: Bus | None = None
        self._scanner: DeviceScanner | None = None
        self._publisher: InventoryPublisher | None = None
        self._reconciler: SliceReconciler | None = None
        self._taints: taints.DeviceTaints | None = None
        self._reporter: ScanReporter | None = None

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        config = self.config
        backend = self.backend
        if backend is None:  # ours to load, and to release
            backend = backends.load_backend(config, seams=self.seams)
            if isinstance(backend, backends.Closeable):
                resources.callback(backend.close)
        self.backend = backend
        self._bus = Bus(config.nats, name=f"dra-discovery/{config.node_name}")
        resources.push_async_callback(self._bus.close)
        kube = await KubeClient.connect(config.kube)
        resources.push_async_callback(kube.close)
        identity = inventory.Identity(
            driver=config.driver_name, node=config.node_name, pool=config.pool, backend=backend.name
        )
        node_events = events.NodeEvents(kube, node=config.node_name)
        self._reporter = ScanReporter(node_events, backend=backend.name)
        self._scanner = DeviceScanner(
            backend,
            identity=identity,
            interval_s=config.rescan_interval_s,
            observer=self._reporter,
        )
        self._publisher = InventoryPublisher(
            self._bus, self._scanner, driver=config.driver_name, node=config.node_name
        )
        if config.publish_device_taints:
            self._taints = taints.DeviceTaints(driver=config.driver_name, node=config.node_name)
        self._reconciler = SliceReconciler(
            kube,
            self._scanner,
            driver=config.driver_name,
            node=config.node_name,
            taints=self._taints,
        )
        await opsserver.open_ops_server(
            config.ops, resources, ready=self.ready, readiness={"slices": self._slices_published}
        )
        log.info(
            "discovery_opened",
            driver=config.driver_name,
            node=config.node_name,
            pool=config.pool,
            backend=backend.name,
            publish_device_taints=config.publish_device_taints,
        )

    async def _slices_published(self) -> str | None:
        """Ready once the slices are published and the API server accepted all of them."""
        if not self.published.is_set():
            return "ResourceSlices not published yet"
        rejections = self._reconciler.rejections if self._reconciler else {}
        if rejections:
            first = next(iter(rejections.values()))
            return f"the API server rejected {len(rejections)} slice(s): {first}"
        return None

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        if not (
            self._bus and self._scanner and self._publisher and self._reconciler and self._reporter
        ):
            raise ProgrammingError("spawn() before open()")
        assert self.backend is not None
        tasks = {
            "bus-connector": self._bus.run(),
            "device-watcher": self.backend.watch(),
            "device-scanner": self._scanner.run(),
            "inventory-publisher": self._publisher.run(),
            "slice-reconciler": self._reconciler.run(),
            "scan-reporter": self._reporter.run(),
        }
        if self._taints is not None:
            tasks["taint-watcher"] = taints.follow(self._bus, self._taints)
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)
        tg.create_task(self._mark_published(self._reconciler), name="readiness-watch")

    async def _mark_published(self, reconciler: SliceReconciler) -> None:
        await reconciler.published.wait()
        self.published.set()
        log.info("slices_published", driver=self.config.driver_name, node=self.config.node_name)
