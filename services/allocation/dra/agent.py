"""The allocation agent: wires the kubelet-facing gRPC servers to the preparer and the watchers.

Order matters: local state (checkpoint, inventory copy, CDI specs) is recovered first, the DRA
socket serves before the registration socket appears (the kubelet dials at once), and shutdown
runs in reverse: deregister, end health streams, stop DRA (with grace), drain NATS, close kube.
A gRPC server that stops on its own is fatal: the process exits and is restarted. The agent is
ready only while the kubelet has it registered; the `Registrar` retries rejected registrations.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc
import structlog

from services.allocation import instruments
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import ClaimReader, KubeReader
from services.allocation.config import AllocationConfig
from services.allocation.dra.announce import Announcers
from services.allocation.dra.claim_publisher import PreparedClaimPublisher, lookup_with
from services.allocation.dra.health_stream import HealthServiceV1, HealthServiceV1Alpha1
from services.allocation.dra.hot_path import KubeletCalls
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.dra.registration import Registrar, RegistrationService
from services.allocation.dra.serialize import InstanceLock
from services.allocation.dra.service import DRAService, DRAServiceV1Beta1
from services.allocation.kubelet import front_guard, socket_server, sockets
from services.allocation.metadata import gate
from services.allocation.metadata.files import MetadataFiles
from services.allocation.mps.daemons import MpsDaemons
from services.allocation.node_view import watchers
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from services.allocation.partitions import by_backend
from services.allocation.status.publisher import DeviceStatusPublisher, StatusAPI
from services.allocation.vfio import binder as vfio_binder
from shared import atomicfile, opsserver
from shared.bus.connection import Bus
from shared.errors import ConfigError
from shared.kube.client import KubeClient
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as dra_v1_grpc
from shared.pb.kubelet.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from shared.pb.kubelet.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from shared.supervisor import eternal

__all__ = ["AllocationAgent"]

log = structlog.get_logger(__name__)

# In-flight prepares get this long to finish when we stop; health streams end at once.
_STOP_GRACE_S = 3.0


class KubeAPI(KubeReader, gate.VersionSource, StatusAPI, Protocol):
    """What the agent asks of the API server: claims read, their status written, /version."""


class AllocationAgent:
    def __init__(self, config: AllocationConfig, *, kube: KubeAPI | None = None) -> None:
        """`kube` replaces the API client built from `config.kube` (tests)."""
        self.config = config
        self.ready = asyncio.Event()
        self._kube = kube
        driver, node = config.driver_name, config.node_name
        self.board = HealthBoard(pool=config.pool_name)
        self.inventory = InventoryCache(
            config.inventory_path, driver=driver, node=node, backend=config.backend
        )
        self.checkpoints = CheckpointStore(config.checkpoint_dir)
        # Neither the specs nor the metadata files are fsynced: at start, recovery compares
        # every completed claim's files with its record and rewrites what a power loss emptied,
        # so prepare pays for no fsync there (the checkpoint is what must survive one).
        self.cdi = CDIWriter(config.cdi_root, driver=driver, durable=False)
        self.metadata = MetadataFiles(config.metadata_dir, durable=False)
        self.partitions = by_backend.build(config)
        self.mps = (
            MpsDaemons(
                config.mps_dir, binary=config.mps_control_path, timeout_s=config.mps_timeout_s
            )
            if config.mps_control_path and config.backend in ("nvml", "sim")
            else None
        )
        self.bus = Bus(
            config.nats, name=f"dra-allocation-{node}", component="allocation", node=node
        )
        self.registration = RegistrationService(driver=driver, endpoint=config.dra_socket_path)
        self.registrar = Registrar(self.registration, config.registration_socket_path)
        # Only with rolling updates may another instance share the checkpoint (docs/contracts.md
        # §2.3).
        self.instance_lock = InstanceLock(
            config.serialize_lock_path if config.rolling_update_uid else None
        )
        # Background writes (prepared-claims KV, device status) give way to kubelet calls.
        self.kubelet_calls = KubeletCalls()
        self.preparer: ClaimPreparer | None = None
        self.claim_publisher: PreparedClaimPublisher | None = None
        self.device_status: DeviceStatusPublisher | None = None
        self._servers: dict[str, grpc.aio.Server] = {}

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        config = self.config
        other = await front_guard.device_plugin_front(
            config.device_plugin_dir, driver=config.driver_name
        )
        if other is not None:
            raise ConfigError(other, field="kubelet_api")
        # Before touching shared state: a process serving on our socket paths is a live
        # instance, and we a second one started without --rolling-update-uid.
        for path in (config.dra_socket_path, config.registration_socket_path):
            await asyncio.to_thread(sockets.refuse_if_served, path)
        atomicfile.make_dirs(config.data_dir, mode=0o750)
        self.checkpoints.load()
        self.inventory.load()
        self.board.set_devices(self.inventory.device_names())
        self.cdi.prepare_root()
        self.instance_lock.open()
        resources.callback(self.instance_lock.close)
        kube = self._kube
        if kube is None:
            client = await KubeClient.connect(config.kube)
            resources.push_async_callback(client.close)
            kube = client
        device_metadata = await gate.enabled(config.device_metadata, kube)
        resources.push_async_callback(self.bus.close)
        reader = ClaimReader(
            kube, driver=config.driver_name, pool=config.pool_name, node=config.node_name
        )
        self.claim_publisher = PreparedClaimPublisher(
            self.bus,
            driver=config.driver_name,
            node=config.node_name,
            lookup=lookup_with(reader),
            quiet=self.kubelet_calls.quiet,
        )
        if config.device_status:
            self.device_status = DeviceStatusPublisher(
                kube,
                driver=config.driver_name,
                node=config.node_name,
                inventory=self.inventory,
                board=self.board,
                quiet=self.kubelet_calls.quiet,
            )
        preparer = ClaimPreparer(
            claims=reader,
            inventory=self.inventory,
            checkpoints=self.checkpoints,
            cdi_writer=self.cdi,
            driver=config.driver_name,
            backend=config.backend,
            instance_lock=self.instance_lock,
            replaced_claim_wait_s=config.replaced_claim_wait_s,
            inventory_wait_s=config.inventory_wait_s,
            crash_at=config.crash_at,
            partitions=self.partitions,
            announce=Announcers(
                self.claim_publisher, *([self.device_status] if self.device_status else [])
            ),
            metadata_files=self.metadata,
            device_metadata=device_metadata,
            mps=self.mps,
            vfio=vfio_binder.build(config),
            calls=self.kubelet_calls,
        )
        self.preparer = preparer
        await preparer.recover()
        completed = [
            r for r in self.checkpoints.records() if r.state is ClaimState.PREPARE_COMPLETED
        ]
        self.claim_publisher.seed(completed)
        if self.device_status is not None:
            self.device_status.seed(completed)
        self._servers["dra-server"] = await _serve(
            config.dra_socket_path, self._dra_services(preparer), resources
        )
        resources.callback(self.board.close)
        await self.registrar.open()
        resources.push_async_callback(self.registrar.close)
        instruments.observe_prepared_claims(lambda: len(self.checkpoints.records()))
        sockets_check = {"sockets": self._sockets_present}
        # A checkpoint directory that cannot be written fails every new claim: say so.
        liveness = {**sockets_check, "checkpoint": self.checkpoints.unusable}
        readiness = {**sockets_check, "registration": self.registration.not_registered}
        await opsserver.open_ops_server(
            config.ops, resources, ready=self.ready, liveness=liveness, readiness=readiness
        )
        log.info("plugin_serving", endpoint=str(config.dra_socket_path))

    async def _sockets_present(self) -> str | None:
        """Both sockets must exist: without them the kubelet can neither register nor call us."""
        for path in (self.config.dra_socket_path, self.config.registration_socket_path):
            if not path.is_socket():
                return f"{path} is gone"
        return None

    def _dra_services(self, preparer: ClaimPreparer) -> Callable[[grpc.aio.Server], None]:
        resend_s, timeout_s = (
            self.config.health_resend_interval_s,
            self.config.health_check_timeout_s,
        )

        def add(server: grpc.aio.Server) -> None:
            v1 = DRAService(preparer)
            dra_v1_grpc.add_DRAPluginServicer_to_server(v1, server)
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(DRAServiceV1Beta1(v1), server)
            health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServiceV1Alpha1(self.board, resend_s=resend_s, timeout_s=timeout_s), server
            )
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServiceV1(self.board, resend_s=resend_s, timeout_s=timeout_s), server
            )

        return add

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        driver, node = self.config.driver_name, self.config.node_name
        tasks = {
            **watchers.node_view_tasks(
                self.bus, cache=self.inventory, board=self.board, driver=driver, node=node
            ),
            "registrar": self.registrar.run(),
            **({"claim-publisher": self.claim_publisher.run()} if self.claim_publisher else {}),
            **({"claim-guard": self.claim_publisher.guard()} if self.claim_publisher else {}),
            **({"device-status": self.device_status.run()} if self.device_status else {}),
            **{name: socket_server.until_terminated(s) for name, s in self._servers.items()},
        }
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)


async def _serve(
    path: Path,
    add_services: socket_server.AddServices,
    resources: contextlib.AsyncExitStack,
) -> grpc.aio.Server:
    """Serve on the unix socket `path`; its stop (and socket removal) goes on `resources`."""
    server = await socket_server.start(path, add_services)
    resources.push_async_callback(socket_server.stop, server, path, grace_s=_STOP_GRACE_S)
    return server
