"""The health policy: observations + what was known before + now -> a verdict per device.

A fault gives a device one taint `<driver>/<cause>=<code>:<effect>`; its class (`rules.py`)
picks the effect and whether the device is UNHEALTHY (fatal, transient) or stays HEALTHY
(informational); ignored codes are no fault. A device the monitor cannot see is UNKNOWN and,
unless a fault's taint already excludes it, gets the `<driver>/unmonitored` taint.

A device passed through to a virtual machine (bound to vfio-pci by a prepared claim, docs/vfio.md)
is not judged by its monitor, which loses it with its host driver: it is PASSTHROUGH, without a
taint, until the claim is unprepared; then the monitor's view counts again. A fault in force when
it was passed through stays, with its taint; an `unmonitored` one ends (see `judge`).

Damping: a device that looks healthy again keeps its taint until it has stayed healthy for
the recovery hold; and apart from a first taint (never delayed), a device's taint changes at
most once per flap window: a change that comes sooner waits (`deferred`) for the window.
Pure: no I/O, no clocks (`now` is passed in, Unix seconds).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from services.health.rules import ClassRule, FaultRules, classify, default_rules
from shared.vendors.parts.observation import Fault, Observation

__all__ = [
    "MESSAGE_MAX",
    "PASSTHROUGH",
    "UNMONITORED",
    "DeviceState",
    "Evaluation",
    "Health",
    "PolicySettings",
    "Taint",
    "Verdict",
    "evaluate",
    "judge",
    "label_value",
    "next_deadline",
    "rule_for",
    "taint_for",
    "taint_key",
]

# The kubelet's limit for health messages (core/v1 ResourceHealthMessageMaxLength).
MESSAGE_MAX = 1024
UNMONITORED = "unmonitored"
"""Cause of the fault a device gets while its monitor fails or hangs."""
PASSTHROUGH = "passthrough"
"""Cause a health record gives a device passed through to a virtual machine (no fault)."""
_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")
_EDGES = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")


class Health(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"
    PASSTHROUGH = "passthrough"
    """Bound to vfio-pci for a virtual machine: neither healthy nor unmonitored, not judged."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    driver: str
    rules: FaultRules = field(default_factory=default_rules)
    """Fault classes, their effects and the ignore lists."""
    recovery_hold_s: float = 0.0
    """Healthy time required before a fault is resolved and its taint removed."""
    flap_window_s: float = 0.0
    """Least time between two changes of a device's taint (a first taint never waits)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"

    @classmethod
    def parse(cls, text: str) -> Taint | None:
        """`key=value:effect` back into a Taint; None for an empty or malformed string."""
        rest, sep, effect = text.rpartition(":")
        key, eq, value = rest.partition("=")
        return cls(key=key, value=value, effect=effect) if sep and eq and key and effect else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceState:
    """What the policy knows about one device between evaluations."""

    device: str
    health: Health
    since: float
    """When `health` last changed."""
    fault: Fault | None = None
    """The fault in force; kept while recovering (hold) and while UNKNOWN."""
    fault_since: float = 0.0
    """When that fault was raised; identifies its alerts."""
    taint: Taint | None = None
    """The taint the device should carry now."""
    healthy_since: float | None = None
    """First healthy observation of a faulty device (the recovery hold runs from here)."""
    taint_changed: float = float("-inf")
    """When the device's taint last changed (the flap window runs from here)."""
    deferred: bool = False
    """A taint change waits for the flap window to end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    state: DeviceState
    raised: bool = False
    """A new fault: Event DeviceUnhealthy and a RAISED alert."""
    resolved: DeviceState | None = None
    """The previous faulty state when its fault ended: Event DeviceRecovered, RESOLVED alert."""
    apply: Taint | None = None
    """Taint to create or update now."""
    remove: Taint | None = None
    """Taint to delete now (recovery, or replaced by a taint with another key)."""

    @property
    def transition(self) -> bool:
        return self.raised or self.resolved is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    verdicts: tuple[Verdict, ...]
    gone: tuple[DeviceState, ...] = ()
    """Devices known before and absent from the observations (they left the inventory)."""

    def states(self) -> dict[str, DeviceState]:
        return {v.state.device: v.state for v in self.verdicts}


def label_value(text: str) -> str:
    """`text` as a valid label value (<= 63 chars, alphanumeric ends, [-_.] inside)."""
    cleaned = _EDGES.sub("", _INVALID.sub("-", text))
    return _EDGES.sub("", cleaned[:63])


def taint_key(driver: str, cause: str) -> str:
    """`<driver>/<cause>`, the cause made a valid label name ("fault" when nothing is left)."""
    return f"{driver}/{label_value(cause) or 'fault'}"


def rule_for(fault: Fault, settings: PolicySettings) -> ClassRule:
    """The class rule of `fault` (an ignored fault is judged by the default class)."""
    rules = settings.rules
    found = classify(cause=fault.cause, code=fault.code, rules=rules)
    return rules.rule(found or rules.default)


def taint_for(fault: Fault, settings: PolicySettings) -> Taint:
    return Taint(
        key=taint_key(settings.driver, fault.cause),
        value=label_value(fault.code),
        effect=rule_for(fault, settings).effect,
    )


def _bounded(fault: Fault) -> Fault:
    if len(fault.message) <= MESSAGE_MAX:
        return fault
    return replace(fault, message=fault.message[: MESSAGE_MAX - 3] + "...")


def _same(a: Fault | None, b: Fault) -> bool:
    return a is not None and (a.cause, a.code) == (b.cause, b.code)


def _ignored(fault: Fault, settings: PolicySettings) -> bool:
    return classify(cause=fault.cause, code=fault.code, rules=settings.rules) is None


def judge(
    observation: Observation,
    prior: DeviceState | None,
    *,
    now: float,
    settings: PolicySettings,
    passthrough: bool = False,
) -> Verdict:
    """The verdict for one device, damped by the flap window; `passthrough`: the device is
    passed through to a virtual machine now (`observation` is then not judged)."""
    if passthrough:
        return _passed_through(observation.device, prior, now)
    fault = observation.fault
    if observation.unknown:
        verdict = _unknown(observation, prior, now, settings)
    elif fault is not None and not _ignored(fault, settings):
        health = Health.UNHEALTHY if rule_for(fault, settings).unhealthy else Health.HEALTHY
        verdict = _faulty(observation.device, _bounded(fault), prior, now, settings, health)
    else:
        verdict = _healthy(observation.device, prior, now, settings)
    return _damped(verdict, prior, now, settings)


def _damped(verdict: Verdict, prior: DeviceState | None, now: float, s: PolicySettings) -> Verdict:
    """`verdict`, or the prior state kept while a taint change waits for the flap window."""
    if verdict.apply is None and verdict.remove is None:
        return verdict
    if prior is None or prior.taint is None or now - prior.taint_changed >= s.flap_window_s:
        return replace(verdict, state=replace(verdict.state, taint_changed=now, deferred=False))
    healthy = verdict.state.health is Health.HEALTHY and verdict.state.fault is None
    healthy_since = (prior.healthy_since or now) if healthy else None
    return Verdict(state=replace(prior, healthy_since=healthy_since, deferred=True))


def _passed_through(device: str, prior: DeviceState | None, now: float) -> Verdict:
    """A device passed through to a virtual machine: what its monitor says of it (or does not)
    is no evidence either way. A fault in force stays, with its taint: not seeing the device is
    no sign that it recovered (no recovery hold runs meanwhile). An `unmonitored` fault ends, at
    once whatever the flap window: the pass-through explains it (the monitor loses the device
    when it leaves its driver, before this agent learns of the claim), and its taint must not
    stay on a device a VM uses. Otherwise the device is PASSTHROUGH, without a taint."""
    if prior is not None and prior.fault is not None and prior.fault.cause != UNMONITORED:
        return Verdict(state=replace(prior, healthy_since=None, deferred=False))
    if prior is not None and prior.health is Health.PASSTHROUGH:
        return Verdict(state=prior)
    old = prior.taint if prior is not None else None
    changed = prior.taint_changed if prior is not None else float("-inf")
    state = DeviceState(
        device=device,
        health=Health.PASSTHROUGH,
        since=now,
        taint_changed=now if old is not None else changed,
    )
    resolved = prior if prior is not None and prior.fault is not None else None
    return Verdict(state=state, resolved=resolved, remove=old)


def _unknown(
    observation: Observation, prior: DeviceState | None, now: float, settings: PolicySettings
) -> Verdict:
    if prior is not None and prior.fault is not None and prior.fault.cause != UNMONITORED:
        # Fault and taint stay: not seeing a device is no evidence that it recovered.
        since = prior.since if prior.health is Health.UNKNOWN else now
        return Verdict(state=replace(prior, health=Health.UNKNOWN, since=since, healthy_since=None))
    fault = observation.fault or Fault(cause=UNMONITORED, message="device is not monitored")
    fault = _bounded(replace(fault, cause=UNMONITORED))
    return _faulty(observation.device, fault, prior, now, settings, Health.UNKNOWN)


def _faulty(
    device: str,
    fault: Fault,
    prior: DeviceState | None,
    now: float,
    settings: PolicySettings,
    health: Health,
) -> Verdict:
    taint = taint_for(fault, settings)
    old = prior.taint if prior is not None else None
    if prior is not None and _same(prior.fault, fault):
        # The same fault again (within the hold, after UNKNOWN, or across a restart): no new
        # alert; the taint is recomputed in case the settings changed since it was applied.
        since = prior.since if prior.health is health else now
        state = replace(
            prior, health=health, since=since, fault=fault, taint=taint, healthy_since=None
        )
        return Verdict(
            state=state, apply=taint if taint != old else None, remove=_replaced(old, taint)
        )
    state = DeviceState(
        device=device,
        health=health,
        since=now,
        fault=fault,
        fault_since=now,
        taint=taint,
        taint_changed=prior.taint_changed if prior is not None else float("-inf"),
    )
    return Verdict(
        state=state,
        raised=True,
        resolved=prior if prior is not None and prior.fault is not None else None,
        apply=taint if taint != old else None,
        remove=_replaced(old, taint),
    )


def _replaced(old: Taint | None, new: Taint) -> Taint | None:
    """`old` when `new` cannot overwrite it (another key means another rule)."""
    return old if old is not None and old.key != new.key else None


def _healthy(
    device: str, prior: DeviceState | None, now: float, settings: PolicySettings
) -> Verdict:
    if prior is None:
        return Verdict(state=DeviceState(device=device, health=Health.HEALTHY, since=now))
    if prior.fault is None and prior.taint is None:
        if prior.health is Health.HEALTHY:
            return Verdict(state=prior)  # the common case: unchanged, not copied
        return Verdict(state=replace(prior, health=Health.HEALTHY, since=now))
    healthy_since = prior.healthy_since if prior.healthy_since is not None else now
    if now - healthy_since < settings.recovery_hold_s:
        return Verdict(state=replace(prior, healthy_since=healthy_since))
    state = DeviceState(
        device=device, health=Health.HEALTHY, since=now, taint_changed=prior.taint_changed
    )
    return Verdict(
        state=state, resolved=prior if prior.fault is not None else None, remove=prior.taint
    )


def evaluate(
    observations: Iterable[Observation],
    prior: Mapping[str, DeviceState],
    *,
    now: float,
    settings: PolicySettings,
    passthrough: Collection[str] = frozenset(),
) -> Evaluation:
    """Verdicts for every observed device; devices known before but not observed are `gone`.
    `passthrough`: the devices passed through to virtual machines now (`judge`)."""
    verdicts = tuple(
        judge(
            o,
            prior.get(o.device),
            now=now,
            settings=settings,
            passthrough=o.device in passthrough,
        )
        for o in observations
    )
    seen = {v.state.device for v in verdicts}
    gone = tuple(state for device, state in sorted(prior.items()) if device not in seen)
    return Evaluation(verdicts=verdicts, gone=gone)


def _deadline(state: DeviceState, settings: PolicySettings) -> float | None:
    window_end = state.taint_changed + settings.flap_window_s
    if state.healthy_since is not None:
        return max(state.healthy_since + settings.recovery_hold_s, window_end)
    return window_end if state.deferred else None


def next_deadline(states: Iterable[DeviceState], *, settings: PolicySettings) -> float | None:
    """The earliest time a recovery hold or a flap window ends, to evaluate right then."""
    ends = [d for d in (_deadline(s, settings) for s in states) if d is not None]
    return min(ends, default=None)
