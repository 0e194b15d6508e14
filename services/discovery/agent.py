"""The discovery agent: wiring of the backend, scanner, inventory publisher and slice reconciler.

No domain logic here. Tasks: `bus-connector`, `device-watcher`, `device-scanner`,
`inventory-publisher`, `inventory-guard` (puts back the inventory over a foreign value),
`slice-reconciler` (or `slice-withdrawer` with `--publish-slices false`: no slices on a
device-plugin node), `scan-reporter` (Events on failed scans), and with
`--publish-device-taints` `taint-watcher` (the health KV). `published` (first successful slice
sync) is the readiness signal; `ready` is set by the supervisor once the tasks are started.
Devices left out of the slices (`unpublished`) are shared by the reconciler, the publisher
(marks in the inventory) and readiness (a detail line that does not fail it).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from services.discovery import backends, events, frontmode, inventory, taints, unpublished
from services.discovery.config import DiscoveryConfig
from services.discovery.publisher import InventoryPublisher
from services.discovery.reconciler import SliceReconciler
from services.discovery.scanner import DeviceScanner
from services.discovery.scanreport import ScanReporter
from services.discovery.withdrawer import SliceWithdrawer
from shared import opsserver
from shared.bus.connection import Bus
from shared.errors import ProgrammingError
from shared.kube.client import KubeClient
from shared.supervisor import eternal
from shared.vendors.parts.discovery import BackendSeams, Closeable, DeviceBackend

__all__ = ["DiscoveryAgent"]

log = structlog.get_logger(__name__)


class DiscoveryAgent:
    """Implements `shared.supervisor.Agent`."""

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        backend: DeviceBackend | None = None,
        seams: BackendSeams | None = None,
    ) -> None:
        """`backend` replaces the configured one; `seams` only its hardware interface."""
        self.config = config
        self.seams = seams
        self.ready = asyncio.Event()
        self.published = asyncio.Event()
        self.unpublished = unpublished.Unpublished()
        """Devices left out of the slices, and why."""
        self.backend = backend
        self._bus: Bus | None = None
        self._scanner: DeviceScanner | None = None
        self._publisher: InventoryPublisher | None = None
        self._reconciler: SliceReconciler | None = None
        self._withdrawer: SliceWithdrawer | None = None
        self._slices: SliceReconciler | SliceWithdrawer | None = None
        """The one of the two that runs, once the node's kubelet front is known."""
        self._kube: KubeClient | None = None
        self._taints: taints.DeviceTaints | None = None
        self._reporter: ScanReporter | None = None

    @property
    def bus(self) -> Bus | None:
        """The agent's NATS connection, once `open` made it."""
        return self._bus

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        config = self.config
        backend = self.backend
        if backend is None:  # ours to load, and to release
            backend = backends.load_backend(config, seams=self.seams)
            if isinstance(backend, Closeable):
                resources.callback(backend.close)
        self.backend = backend
        self._bus = Bus(
            config.nats,
            name=f"dra-discovery/{config.node_name}",
            component="discovery",
            node=config.node_name,
        )
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
            self._bus,
            self._scanner,
            driver=config.driver_name,
            node=config.node_name,
            dropped=self.unpublished,
        )
        if config.publish_device_taints:
            self._taints = taints.DeviceTaints(driver=config.driver_name, node=config.node_name)
        self._kube = kube
        self._reconciler = SliceReconciler(
            kube,
            self._scanner,
            driver=config.driver_name,
            node=config.node_name,
            taints=self._taints,
            dropped_devices=self.unpublished,
        )
        self._withdrawer = SliceWithdrawer(kube, driver=config.driver_name, node=config.node_name)
        await opsserver.open_ops_server(
            config.ops,
            resources,
            ready=self.ready,
            readiness={"slices": self._slices_published},
            notes={"devices": self._devices_unpublished},
        )
        log.info(
            "discovery_opened",
            driver=config.driver_name,
            node=config.node_name,
            pool=config.pool,
            backend=backend.name,
            publish_device_taints=config.publish_device_taints,
            publish_slices=config.publish_slices,
        )

    async def _slices_published(self) -> str | None:
        """Ready once the slices are published and the API server accepted all of them."""
        if not self.published.is_set():
            return "ResourceSlices not published yet"
        rejections = self._slices.rejections if self._slices else {}
        if rejections:
            first = next(iter(rejections.values()))
            return f"the API server rejected {len(rejections)} slice(s): {first}"
        return None

    async def _devices_unpublished(self) -> str | None:
        return self.unpublished.summary()

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
            "inventory-guard": self._publisher.guard(),
            "slice-reconciler": self._serve_slices(),
            "scan-reporter": self._reporter.run(),
        }
        if self._taints is not None:
            tasks["taint-watcher"] = taints.follow(self._bus, self._taints)
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)

    async def _serve_slices(self) -> None:
        """Eternal: publish the slices, or withdraw them on a device-plugin node."""
        if not (self._kube and self._reconciler and self._withdrawer):
            raise ProgrammingError("slices served before open()")
        config = self.config
        publish = await frontmode.publishes_slices(
            self._kube, node=config.node_name, mode=config.publish_slices
        )
        self._slices = self._reconciler if publish else self._withdrawer
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._mark_published(self._slices), name="readiness-watch")
            await self._slices.run()

    async def _mark_published(self, slices: SliceReconciler | SliceWithdrawer) -> None:
        await slices.published.wait()
        self.published.set()
        log.info("slices_published", driver=self.config.driver_name, node=self.config.node_name)
