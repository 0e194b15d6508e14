"""The health evaluator: runs the policy over the latest observations and acts on verdicts.

Wakes on every new view from the monitor (so a fault is handled at once), at a recovery hold's
or flap window's end, and at least every poll interval. A pass whose inputs (the view, the
topology, the pass-through devices, what the taint writer answers from) equal those of a pass
that changed nothing only flushes the records when a refresh is due: an idle node does not judge
its devices again every second. Parents' faults reach their partitions first
(`attribution`, over the inventory's topology). Each fault transition is one trace, rooted in
a `health.evaluate_fault` span: the KV record, the taint, the Node Event and the alert. Each
record carries every taint the device should have now (`record_taints`): its fault taint and
its drain; a drain or undrain wakes the evaluator (`wake()`) so the record follows at once.
A faulty device that is no longer reported (it left, or an earlier run named it otherwise)
loses its record and taint and gets a RESOLVED alert that says it was withdrawn.

Devices passed through to virtual machines (`set_passthrough`, from the node's prepared claims)
and the partitions carved from them are PASSTHROUGH (`policy.judge`): not judged by the monitor,
and kept when the monitor no longer reports them (it loses a device bound to vfio-pci). Until the
claims are first known, the devices an earlier run recorded as passed through stay so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from services.health import alerts, attribution, events, policy, record_taints
from services.health.alerts import AlertPublisher
from services.health.attribution import Topology
from services.health.events import DeviceEvent, NodeEventWriter
from services.health.pod_events import PodEventWriter
from services.health.policy import DeviceState, Health, PolicySettings, Taint, Verdict
from services.health.record_taints import TaintTimes
from services.health.recorder import HealthRecorder, state_from_record, to_record
from services.health.taints import TaintWriter
from shared import telemetry
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import health_pb2
from shared.vendors.parts.observation import Observation, Observations

__all__ = ["HealthEvaluator"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)

# Poll intervals between two passes of a settled evaluator. Everything that can change a
# verdict or a record wakes it (a view, the topology, pass-through devices, a drain, the taint
# writer's answers, a reconnect) or is a deadline it sleeps until; this bounds what was missed.
_SETTLED_POLLS = 10


class HealthEvaluator:
    def __init__(
        self,
        *,
        settings: PolicySettings,
        node: str,
        recorder: HealthRecorder,
        taints: TaintWriter,
        events: NodeEventWriter,
        alerts: AlertPublisher,
        poll_interval_s: float,
        clock: Callable[[], float] = time.time,
        pod_events: PodEventWriter | None = None,
    ) -> None:
        """`pod_events`: also tell the pods using a device that turned unhealthy."""
        self._settings = settings
        self._pod_events = pod_events
        self._node = node
        self._recorder = recorder
        # Each device's last record and what it was made from (see `_records`).
        self._made: dict[str, tuple[tuple[Any, ...], health_pb2.DeviceHealth]] = {}
        self._taints = taints
        self._events = events
        self._alerts = alerts
        self._poll_s = poll_interval_s
        self._clock = clock
        self._latest: Observations | None = None
        self._topology = Topology()
        self._states: dict[str, DeviceState] = {}
        self._pool = node
        self._seeded = False
        self._seed_failed = False
        self._taint_times = TaintTimes()
        self._passthrough: frozenset[tuple[str, str]] | None = None
        """(pool, device) passed through to VMs by the node's prepared claims; None: not known
        yet."""
        self._wake = asyncio.Event()
        self._settled_on: tuple[object, ...] | None = None
        """The inputs of the last pass, when it changed nothing (see `evaluate`)."""
        self.evaluations = 0

    @property
    def states(self) -> dict[str, DeviceState]:
        return dict(self._states)

    @property
    def topology(self) -> Topology:
        """The partition topology of the latest inventory."""
        return self._topology

    def wake(self) -> None:
        """Evaluate at once (e.g. a drain changed what a record carries)."""
        self._wake.set()

    def observe(self, observations: Observations) -> None:
        """The monitor's sink: keep the newest view and evaluate at once."""
        self._latest = observations
        self._wake.set()

    def set_passthrough(self, devices: Iterable[tuple[str, str]]) -> None:
        """The devices, as (pool, device), the node's prepared claims pass through to virtual
        machines now (all of them, once the claims were read); evaluate at once on a change."""
        found = frozenset(devices)
        if found != self._passthrough:
            self._passthrough = found
            self._wake.set()

    def _passed_through(self, pool: str) -> frozenset[str]:
        if self._passthrough is not None:
            return frozenset(d for p, d in self._passthrough if p == pool)
        # The claims are not known yet (the agent just started): what an earlier run recorded.
        return frozenset(d for d, s in self._states.items() if s.health is Health.PASSTHROUGH)

    def set_topology(self, topology: Topology) -> None:
        """Which devices are partitions of which (from the inventory); evaluate at once."""
        if topology != self._topology:
            self._topology = topology
            self._wake.set()

    async def run(self) -> None:
        """Eternal: evaluate, then sleep until news, a hold deadline or the poll interval; when
        settled, until news, a deadline, a record's refresh or `_SETTLED_POLLS` intervals."""
        while True:
            self._wake.clear()
            await self.evaluate()
            reraise_if_cancelling()
            timeout = self._poll_s
            if self._settled_on is not None and not self._recorder.due():
                refresh = self._recorder.next_refresh - self._clock()
                timeout = min(self._poll_s * _SETTLED_POLLS, max(timeout, refresh))
            deadline = policy.next_deadline(self._states.values(), settings=self._settings)
            if deadline is not None:
                timeout = max(0.01, min(timeout, deadline - self._clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def evaluate(self) -> None:
        observations = self._latest
        if observations is None:
            return  # the device list is not known yet
        if not self._seeded:
            await self._seed()
        now = self._clock()
        inputs = self._inputs(observations)
        if inputs == self._settled_on and not self._due(now):
            # Nothing it depends on changed since a pass that changed nothing: this one would
            # not either. The recorder still refreshes and resyncs its records.
            if self._recorder.due():
                await self._recorder.flush()
            self.evaluations += 1
            return
        before = self._states
        claimed = self._passed_through(observations.pool)
        devices = attribution.attribute(
            (*observations.devices, *self._unreported(observations, claimed)), self._topology
        )
        passthrough = attribution.with_partitions(claimed, self._topology)
        evaluation = policy.evaluate(
            devices, self._states, now=now, settings=self._settings, passthrough=passthrough
        )
        self._log_passthrough(evaluation.states())
        self._states, self._pool = evaluation.states(), observations.pool
        self._recorder.set(self._records(now))
        contexts: dict[str, Context] = {}
        origins = {o.device: o.origin for o in observations.devices}
        for verdict in evaluation.verdicts:
            if verdict.transition:
                origin = origins.get(verdict.state.device, ())
                contexts[verdict.state.device] = await self._on_transition(
                    verdict, now, origin=origin
                )
        for state in evaluation.gone:
            log.info("device_left", node=self._node, device=state.device)
            if state.fault is not None:
                self._withdraw(state, now=now)
        taints = {d: s.taint for d, s in self._states.items() if s.taint is not None}
        self._taints.want(taints, pool=self._pool, contexts=contexts)
        await self._recorder.flush()
        self.evaluations += 1
        steady = self._seeded and not evaluation.gone and self._states == before
        self._settled_on = inputs if steady and not _acted(evaluation) else None

    def _inputs(self, observations: Observations) -> tuple[object, ...]:
        """Everything a pass reads besides the states and the clock."""
        return (observations, self._topology, self._passthrough, self._taints.answers_from())

    def _due(self, now: float) -> bool:
        """A recovery hold or a flap window has ended: time alone changes a verdict."""
        deadline = policy.next_deadline(self._states.values(), settings=self._settings)
        return deadline is not None and now >= deadline

    def _unreported(
        self, observations: Observations, claimed: frozenset[str]
    ) -> tuple[Observation, ...]:
        """Passed-through devices the monitor no longer reports (NVML loses a GPU bound to
        vfio-pci): kept, not gone. Only devices this node has (judged before, or in the
        inventory), so that a claim cannot add one."""
        seen = {o.device for o in observations.devices}
        known = set(self._states) | set(self._topology.devices)
        return tuple(
            Observation(device=d, unknown=True) for d in sorted(claimed - seen) if d in known
        )

    def _log_passthrough(self, states: dict[str, DeviceState]) -> None:
        for device, state in states.items():
            before = self._states.get(device)
            was = before is not None and before.health is Health.PASSTHROUGH
            passed = state.health is Health.PASSTHROUGH
            if passed and not was:
                log.info("device_passed_through", node=self._node, device=device)
            elif was and not passed:
                log.info("device_passthrough_ended", node=self._node, device=device)

    async def _seed(self) -> None:
        """Start from the records an earlier run left, so faults and `since` carry over.

        While NATS cannot list them (the agent starts before it connects) evaluation goes on
        and the next one tries again; records that come late add only the devices not judged
        since (so a device an earlier run named, and this one does not report, is withdrawn).
        """
        try:
            existing = await self._recorder.existing()
        except BusUnavailableError as exc:
            if not self._seed_failed:
                log.warning("health_records_unreadable", node=self._node, error=str(exc))
            self._seed_failed = True
            return
        now = self._clock()
        loaded = {
            d: state_from_record(r, now=now)
            for d, r in existing.items()
            if r.device == d and d not in self._states
        }
        self._states = {**loaded, **self._states}
        for device, record in existing.items():
            if record.device == device:
                self._taint_times.seed(device, record.taints)
                self._taints.restore(device, map(record_taints.from_record, record.taints))
        self._seeded = True
        if loaded:
            log.info("health_records_loaded", node=self._node, devices=len(loaded))

    def _records(self, now: float) -> dict[str, health_pb2.DeviceHealth]:
        """Each device's record; one whose inputs did not change since the last evaluation is
        the same object as then."""
        driver = self._settings.driver
        wanted = {device: self._wanted_taints(state) for device, state in self._states.items()}
        taints = self._taint_times.stamp(wanted, now=now)
        records: dict[str, health_pb2.DeviceHealth] = {}
        made: dict[str, tuple[tuple[Any, ...], health_pb2.DeviceHealth]] = {}
        for device, state in self._states.items():
            applied = self._taints.applied(state.taint)
            inputs = (
                state,
                self._pool,
                applied,
                [(t.key, t.value, t.effect, t.time_added_unix_ms) for t in taints[device]],
            )
            before = self._made.get(device)
            if before is not None and before[0] == inputs:
                record = before[1]
            else:
                record = to_record(
                    state,
                    driver=driver,
                    node=self._node,
                    pool=self._pool,
                    taint=applied,
                    taints=taints[device],
                )
            made[device] = (inputs, record)
            records[device] = record
        self._made = made
        return records

    def _wanted_taints(self, state: DeviceState) -> list[Taint]:
        drain = self._taints.drain_taint(state.device)
        return [t for t in (state.taint, drain) if t is not None]

    async def _on_transition(
        self, verdict: Verdict, now: float, *, origin: tuple[tuple[str, str], ...] = ()
    ) -> Context:
        state = verdict.state
        fault = state.fault or (verdict.resolved.fault if verdict.resolved else None)
        attributes = {
            "device": state.device,
            "node": self._node,
            "health": state.health.value,
            "cause": fault.cause if fault is not None else "",
        }
        # A fault reported over NATS continues the reporter's trace (dractl, an operator's tool);
        # a recovery continues the trace of the clear, not the fault's (maybe hours old) one.
        report = state.fault.origin if state.fault is not None else origin
        parent = telemetry.extract(telemetry.carried(dict(report))) if report else None
        with tracer.start_as_current_span(
            "health.evaluate_fault", context=parent, attributes=attributes
        ):
            context = otel_context.get_current()
            if verdict.resolved is not None:
                self._resolve(verdict.resolved, now=now, context=context)
            if verdict.raised:
                self._raise(state, context=context)
            await self._recorder.flush(device=state.device)
        return context

    def _raise(self, state: DeviceState, *, context: Context) -> None:
        fault = state.fault
        assert fault is not None
        log.warning(
            "device_unhealthy",
            node=self._node,
            device=state.device,
            cause=fault.cause,
            code=fault.code,
            taint=str(state.taint),
        )
        detail = f"{fault.cause} {fault.code}".strip() + (
            f": {fault.message}" if fault.message else ""
        )
        event = DeviceEvent(
            reason=events.UNHEALTHY, device=state.device, message=detail, at=state.since
        )
        self._events.emit(event, context=context)
        if self._pod_events is not None and state.health is policy.Health.UNHEALTHY:
            self._pod_events.emit(event, pool=self._pool, context=context)
        alert = alerts.raised(
            state,
            driver=self._settings.driver,
            node=self._node,
            pool=self._pool,
            taint=self._taints.applied(state.taint),
        )
        self._alerts.publish(alert, context=context)

    def _withdraw(self, gone: DeviceState, *, now: float) -> None:
        """Close the fault of a device no longer reported (it left the inventory, or an
        earlier run named it differently: the Ascend names before they were discovery's).
        Its record and taint rule go with it (`_records`, `want`); the RESOLVED alert says so."""
        fault = gone.fault
        assert fault is not None
        log.warning(
            "device_fault_withdrawn", node=self._node, device=gone.device, cause=fault.cause
        )
        note = "withdrawn: the device is no longer reported on this node"
        message = f"{fault.message} ({note})" if fault.message else note
        with tracer.start_as_current_span(
            "health.withdraw_fault", attributes={"device": gone.device, "node": self._node}
        ):
            alert = alerts.resolved(
                replace(gone, fault=replace(fault, message=message)),
                driver=self._settings.driver,
                node=self._node,
                pool=self._pool,
                taint=self._taints.applied(gone.taint),
                now=now,
            )
            self._alerts.publish(alert, context=otel_context.get_current())

    def _resolve(self, old: DeviceState, *, now: float, context: Context) -> None:
        fault = old.fault
        cause = fault.cause if fault is not None else "fault"
        log.info("device_recovered", node=self._node, device=old.device, cause=cause)
        self._events.emit(
            DeviceEvent(
                reason=events.RECOVERED,
                device=old.device,
                message=f"recovered from {cause}",
                at=now,
            ),
            context=context,
        )
        alert = alerts.resolved(
            old,
            driver=self._settings.driver,
            node=self._node,
            pool=self._pool,
            taint=self._taints.applied(old.taint),
            now=now,
        )
        self._alerts.publish(alert, context=context)


def _acted(evaluation: policy.Evaluation) -> bool:
    """Whether a verdict raised, resolved or changed a taint."""
    return any(
        v.transition or v.apply is not None or v.remove is not None for v in evaluation.verdicts
    )
