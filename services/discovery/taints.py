"""Device taints from the health agent's records, to publish inside the node's ResourceSlices.

With the health agent's `--taint-target slice`, each device's health record (health KV,
`DeviceHealth.taints`) lists every taint the health agent wants on the device, and no
DeviceTaintRule is written; with `--publish-device-taints` this agent publishes those taints
in `devices[].taints` of the device's ResourceSlice.

`DeviceTaints` is the node's view (device -> taints in API JSON, canonical order), fed by
`follow()` from a KV watch. It only reports a change when the taints of some device really
changed, so the periodic refresh of a record (new `updated_unix_ms`) never rewrites a slice.
Until the watch first lists the KV (NATS down at start), it holds the taints the slices
already carry (`seed`), so a restarted agent never lifts a taint it cannot yet confirm. A
record that does not decode, names another device, driver or node, or carries a taint the
API would refuse is logged; a bad record changes nothing, a bad taint is left out.

Each record change that carries a trace is handled in a span of it (`discovery.health_update`,
with the device): a child of the writer's span for a change seen live, linked (a new trace)
for a value replayed after a (re)start, as the allocation agent's watchers do.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import structlog

from shared import telemetry
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2

__all__ = [
    "EFFECTS",
    "DeviceTaints",
    "follow",
    "published_taints",
    "taint_json",
    "taint_problem",
    "taints_of",
]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)

Obj = dict[str, Any]
Taints = tuple[Obj, ...]

EFFECTS = ("NoExecute", "NoSchedule", "None")
"""Known effects, strongest first (1.34 servers accept the first two only: `apirules`)."""
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_MAX_NAME = 63
_MAX_PREFIX = 253


def _label_name(key: str) -> str:
    """Why `key` is not a label name (`[prefix/]name`), or "" when it is."""
    prefix, slash, name = key.rpartition("/")
    if not name or len(name) > _MAX_NAME or not _NAME.match(name):
        return f"name part must be 1-{_MAX_NAME} alphanumerics, '-', '_' or '.'"
    if slash and (len(prefix) > _MAX_PREFIX or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix must be a DNS subdomain of at most {_MAX_PREFIX} characters"
    return ""


def taint_problem(taint: health_pb2.DeviceTaint) -> str:
    """Why the API server would refuse `taint`, or "" when it would not."""
    if reason := _label_name(taint.key):
        return f"key {taint.key!r}: {reason}"
    if len(taint.value) > _MAX_NAME or not _NAME.match(taint.value):
        return f"value {taint.value!r} is not a label value"
    if taint.effect not in EFFECTS:
        return f"effect {taint.effect!r} is not one of {', '.join(EFFECTS)}"
    if taint.time_added_unix_ms > _LAST_RFC3339_MS:
        return f"time added {taint.time_added_unix_ms} ms is past the year 9999"
    return ""


_LAST_RFC3339_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) * 1000 + 999
"""The last millisecond an RFC 3339 `timeAdded` (four-digit year) can hold."""


def _rfc3339(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taint_json(taint: health_pb2.DeviceTaint) -> Obj:
    """A taint as in `devices[].taints[]`; empty fields left out, as the API serves them."""
    result: Obj = {"key": taint.key}
    if taint.value:
        result["value"] = taint.value
    result["effect"] = taint.effect
    if taint.time_added_unix_ms > 0:
        result["timeAdded"] = _rfc3339(taint.time_added_unix_ms)
    return result


def _order(taint: Mapping[str, Any]) -> tuple[int, str, str]:
    effect = str(taint.get("effect"))
    rank = EFFECTS.index(effect) if effect in EFFECTS else len(EFFECTS)
    return rank, str(taint.get("key")), str(taint.get("value", ""))


def _canonical(taints: Iterable[Obj]) -> Taints:
    """Strongest effect first, then by key and value; one taint per (key, value, effect)."""
    unique: dict[tuple[int, str, str], Obj] = {}
    for taint in taints:
        unique.setdefault(_order(taint), taint)
    return tuple(unique[k] for k in sorted(unique))


def taints_of(record: health_pb2.DeviceHealth) -> tuple[Taints, list[str]]:
    """The record's taints the API would accept (canonical order), and why others were not."""
    kept: list[Obj] = []
    problems: list[str] = []
    for taint in record.taints:
        if problem := taint_problem(taint):
            problems.append(problem)
        else:
            kept.append(taint_json(taint))
    return _canonical(kept), problems


def published_taints(slices: Iterable[Mapping[str, Any]]) -> dict[str, Taints]:
    """Device -> the taints the given ResourceSlices carry now."""
    found: dict[str, Taints] = {}
    for item in slices:
        for device in (item.get("spec") or {}).get("devices") or []:
            if taints := device.get("taints"):
                found[str(device.get("name"))] = _canonical(dict(t) for t in taints)
    return found


class DeviceTaints:
    """The taints the health agent wants on this node's devices, with change notification."""

    def __init__(self, *, driver: str, node: str) -> None:
        self.driver = driver
        self.node = node
        self._taints: dict[str, Taints] = {}
        self._version = 0
        self._changed = asyncio.Event()
        self._listed = False
        # Keys of the listing in progress: after it, the devices not named lose their taints.
        self._seen: set[str] = set()
        self._epoch = -1
        # Devices whose taints came from a record since start (seeding leaves them alone).
        self._recorded: set[str] = set()

    @property
    def listed(self) -> bool:
        """Whether the health KV has been listed once (before: seeded taints, if any)."""
        return self._listed

    @property
    def version(self) -> int:
        """Grows by one with every real change."""
        return self._version

    def current(self) -> Mapping[str, Sequence[Obj]]:
        """Device -> its taints (strongest first), read-only; devices without taints absent."""
        return MappingProxyType(self._taints)

    async def next(self, *, after: int) -> int:
        """Wait until the version is above `after`; the new version."""
        while self._version <= after:
            await self._changed.wait()
        return self._version

    def seed(self, taints: Mapping[str, Taints]) -> None:
        """Start from the taints the slices carry; ignored once the KV has been listed."""
        if self._listed:
            return
        recorded = {d: t for d, t in self._taints.items() if d in self._recorded}
        seeded = {d: t for d, t in taints.items() if d not in self._recorded}
        self._replace({**seeded, **recorded})

    def apply(self, change: kv.KVChange, *, prefix: str, epoch: int = 0) -> None:
        """One change of the watch: a record, a deletion, or the end of a (re)listing.

        `epoch` is the bus connection's: a new one means the watch restarted, and its
        listing starts afresh.
        """
        if epoch != self._epoch:
            self._epoch, self._seen = epoch, set()
        if change.synced:
            self._listed = True
            self._replace({d: t for d, t in self._taints.items() if d in self._seen})
            self._seen = set()
            return
        device = change.key.removeprefix(prefix)
        if change.value is None:
            self._seen.discard(device)
            self._set(device, ())
            return
        self._seen.add(device)  # a bad record still exists: its device keeps its taints
        try:
            record = codec.decode(health_pb2.DeviceHealth, change.value, subject=change.key)
        except MalformedMessageError as exc:
            log.error("health_record_malformed", key=change.key, error=str(exc))
            return
        if problem := self._foreign(record, device):
            log.error("health_record_malformed", key=change.key, error=problem)
            return
        taints, problems = taints_of(record)
        for problem in problems:
            log.error("device_taint_invalid", key=change.key, device=device, error=problem)
        self._set(device, taints)

    def _foreign(self, record: health_pb2.DeviceHealth, device: str) -> str:
        for field, expected in (("device", device), ("driver", self.driver), ("node", self.node)):
            found = getattr(record, field)
            if found and found != expected:
                return f"record is for {field} {found!r}, its key for {expected!r}"
        return ""

    def _set(self, device: str, taints: Taints) -> None:
        self._recorded.add(device)
        updated = dict(self._taints)
        if taints:
            updated[device] = taints
        else:
            updated.pop(device, None)
        self._replace(updated)

    def _replace(self, taints: dict[str, Taints]) -> None:
        if taints == self._taints:
            return
        self._taints = taints
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()


async def follow(bus: Bus, taints: DeviceTaints) -> None:
    """Eternal: keep `taints` equal to the node's health records (resubscribes after outages)."""
    names = bus.names
    prefix = names.health_key(taints.driver, taints.node, "")
    async for change in kv.watch(
        bus, bucket=names.health_bucket, keys=names.health_keys(taints.driver, taints.node)
    ):
        # The end-of-listing marker carries no trace: no span.
        with telemetry.continued(
            tracer,
            "discovery.health_update",
            change.trace,
            linked=change.replayed,
            attributes={"device": change.key.removeprefix(prefix), "node": taints.node},
        ):
            taints.apply(change, prefix=prefix, epoch=bus.epoch)
