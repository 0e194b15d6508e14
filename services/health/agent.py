"""The health agent's wiring: NATS, the kube client, the monitor and the tasks around them.

Tasks: bus-connector, device-watcher (the monitor under its watchdog), inventory-watcher
(partition topology), health-evaluator (the policy loop), taint-writer, drain-control,
event-writer, claim-watcher (the node's prepared claims: pod Events, devices passed through to
VMs), pod-event-writer, alert-publisher and (with `--alert-webhook-url`) alert-webhook. No domain
logic lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from services.health import (
    instruments,
    inventory_watcher,
    monitors,
    policyfile,
    prepared_claims,
    rules,
)
from services.health.alerts import AlertPublisher
from services.health.config import HealthConfig
from services.health.drain import DrainControl
from services.health.evaluator import HealthEvaluator
from services.health.events import NodeEventWriter
from services.health.monitors.watchdog import Watchdog
from services.health.pod_events import PodEventWriter
from services.health.policy import PolicySettings
from services.health.recorder import HealthRecorder
from services.health.taints import TaintWriter
from services.health.webhook import WebhookNotifier
from shared import opsserver
from shared.bus.connection import Bus
from shared.errors import ConfigError
from shared.kube.client import KubeClient
from shared.sim import profile
from shared.supervisor import eternal
from shared.vendors.parts.health import AscendOptions, DeviceMonitor, NvmlOptions
from shared.vendors.parts.observation import Fault

if TYPE_CHECKING:
    from shared.vendors.nvidia.nvml_events import NVMLEvents

__all__ = ["HealthAgent"]


class HealthAgent:
    """`shared.supervisor.Agent` for the health agent; the parts are public for tests."""

    def __init__(
        self,
        config: HealthConfig,
        *,
        clock: Callable[[], float] = time.time,
        monitor: DeviceMonitor | None = None,
        nvml_library: NVMLEvents | None = None,
    ) -> None:
        """`monitor` replaces the one `config.monitor` names (tests pass a FakeMonitor);
        `nvml_library` the real NVML of the nvml monitor (tests pass a fake)."""
        if not config.node_name:
            raise ConfigError("node name is required", field="node_name")
        self.config = config
        self.rules = policyfile.load(
            config.policy_file,
            effect=config.taint_effect,
            ascend_unknown_codes=config.ascend_unknown_codes,
            extra_ignored_xids=config.additional_xids_to_ignore,
        )
        self._given_monitor = monitor
        self._nvml_library = nvml_library
        self.ready = asyncio.Event()
        self._clock = clock
        self.bus = Bus(
            config.nats,
            name=f"dra-health/{config.node_name}",
            component="health",
            node=config.node_name,
        )
        self.monitor: DeviceMonitor
        self.watchdog: Watchdog
        self.drain: DrainControl
        self.kube: KubeClient
        self.recorder: HealthRecorder
        self.taints: TaintWriter
        self.events: NodeEventWriter
        self.pod_events: PodEventWriter
        self.alerts: AlertPublisher
        self.webhook: WebhookNotifier | None = None
        self.evaluator: HealthEvaluator

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        self.monitor = self._given_monitor or self._load_monitor()
        self.kube = await KubeClient.connect(self.config.kube)
        resources.push_async_callback(self.kube.close)
        resources.push_async_callback(self.bus.close)  # closed first: drain NATS, then kube
        self._build()
        instruments.observe_device_health(lambda: self.evaluator.states)
        await opsserver.open_ops_server(self.config.ops, resources, ready=self.ready)

    def _load_monitor(self) -> DeviceMonitor:
        config = self.config
        faults = profile.load(config.sim_profile).faults if config.monitor == "sim" else ()
        return monitors.load(
            config.monitor,
            bus=self.bus,
            driver=config.driver_name,
            node=config.node_name,
            faults=faults,
            refresh_s=config.monitor_deadline_s / 3,
            ascend_options=AscendOptions(
                npu_smi=config.npu_smi_path,
                timeout_s=config.npu_smi_timeout_s,
                poll_s=config.ascend_poll_s,
                isolate_unknown=self.rules.ascend_unknown_codes == "isolate",
            ),
            nvml_options=NvmlOptions(
                wait_ms=config.nvml_event_timeout_ms, counters_s=config.nvml_counters_s
            ),
            nvml_library=self._nvml_library,
            ignored=self._ignored,
            mig_partition=self._mig_partition,
        )

    def _mig_partition(self, gpu: str, profile_id: int, placement_start: int) -> str | None:
        """The inventory's MIG partition of `gpu` at that GPU-instance profile and placement."""
        return self.evaluator.topology.gpu_instances.get((gpu, profile_id, placement_start))

    def _claims_changed(self) -> None:
        """The node's prepared claims changed: the devices passed through to VMs may have."""
        self.evaluator.set_passthrough(self.prepared_claims.passthrough())

    def _ignored(self, fault: Fault) -> bool:
        """Whether the policy ignores `fault` (so a monitor never lets it hide a real one)."""
        return rules.classify(cause=fault.cause, code=fault.code, rules=self.rules) is None

    def _load_webhook(self) -> WebhookNotifier | None:
        config = self.config
        if not config.alert_webhook_url:
            return None
        return WebhookNotifier(
            config.alert_webhook_url,
            timeout_s=config.alert_webhook_timeout_s,
            attempts=config.alert_webhook_attempts,
            queue_size=config.alert_webhook_queue_size,
            resend_s=config.alert_webhook_resend_s,
        )

    def _build(self) -> None:
        config, driver, node = self.config, self.config.driver_name, self.config.node_name
        self.recorder = HealthRecorder(
            self.bus, driver=driver, node=node, refresh_s=config.health_refresh_s, clock=self._clock
        )
        self.taints = TaintWriter(self.kube, driver=driver, node=node, target=config.taint_target)
        self.events = NodeEventWriter(self.kube, node=node, namespace=config.event_namespace)
        self.prepared_claims = prepared_claims.PreparedClaims()
        self.pod_events = PodEventWriter(
            self.kube, claims=self.prepared_claims, driver=driver, node=node
        )
        self.webhook = self._load_webhook()
        self.alerts = AlertPublisher(
            self.bus,
            driver=driver,
            node=node,
            max_age_s=config.alert_max_age_s,
            queue_size=config.alert_queue_size,
            notify=self.webhook.notify if self.webhook is not None else None,
        )
        self.evaluator = HealthEvaluator(
            settings=PolicySettings(
                driver=driver,
                rules=self.rules,
                recovery_hold_s=config.recovery_hold_s,
                flap_window_s=config.flap_window_s,
            ),
            node=node,
            recorder=self.recorder,
            taints=self.taints,
            events=self.events,
            alerts=self.alerts,
            poll_interval_s=config.poll_interval_s,
            clock=self._clock,
            pod_events=self.pod_events,
        )
        self.taints.answers_changed = self.evaluator.wake
        name = config.monitor if self._given_monitor is None else type(self.monitor).__name__
        self.watchdog = Watchdog(self.monitor, name=name, deadline_s=config.monitor_deadline_s)
        self.drain = DrainControl(
            self.bus,
            driver=driver,
            node=node,
            taints=self.taints,
            devices=lambda: self.evaluator.states.keys(),
            changed=self.evaluator.wake,
        )

    async def _wake_on_reconnect(self) -> None:
        """Eternal: a new connection wakes the evaluator, whose flush resyncs the records."""
        epoch = self.bus.epoch
        while True:
            epoch = await self.bus.wait_epoch_after(epoch)
            self.evaluator.wake()

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        tasks = {
            "bus-connector": self.bus.run(),
            "device-watcher": self.watchdog.run(self.evaluator.observe),
            "inventory-watcher": inventory_watcher.inventory_watcher(
                self.bus,
                driver=self.config.driver_name,
                node=self.config.node_name,
                sink=self.evaluator.set_topology,
            ),
            "health-evaluator": self.evaluator.run(),
            "health-reconnect-waker": self._wake_on_reconnect(),
            "health-record-guard": self.recorder.guard(
                counter=instruments.HEALTH_RECORDS_REASSERTED
            ),
            "taint-writer": self.taints.run(),
            "drain-control": self.drain.run(),
            "event-writer": self.events.run(),
            "claim-watcher": prepared_claims.claim_watcher(
                self.bus,
                claims=self.prepared_claims,
                driver=self.config.driver_name,
                node=self.config.node_name,
                changed=self._claims_changed,
            ),
            "pod-event-writer": self.pod_events.run(),
            "alert-publisher": self.alerts.run(),
        }
        if self.webhook is not None:
            tasks["alert-webhook"] = self.webhook.run()
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)
