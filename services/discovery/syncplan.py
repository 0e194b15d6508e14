"""The plan that turns the node's actual slices into the desired pool (pure).

`plan()` compares the desired contents with the slices that exist and decides the writes
and the pool generation by the rule of the Go helper's resourceslice controller
(k8s.io/dynamic-resource-allocation/resourceslice, `syncPool`):

- the generation stays when no slice must be created and at most one existing slice changes:
  that is one atomic update, so a scheduler never sees a device twice or a half-written pool
  (obsolete slices are deleted first; meanwhile the pool is only incomplete, never wrong);
- otherwise (a new slice, or devices moving between slices) it is bumped and every slice of
  the pool is rewritten, so that the scheduler, which only uses the newest generation and
  only once `resourceSliceCount` slices of it exist, never mixes old and new slices.

Matching existing slices to desired contents: same device and counter-set names first, then
the v0.36 index prefix of the name (`slices.slice_index`), then the rest in name order.
Slices are never renamed, so slices named by an older agent (`<node>-<driver>-xxxxx`) are
adopted without churn; only slices that must be created get index names.

Taint `timeAdded`: a desired taint without one keeps the existing slice's (same key, value
and effect), and times within a second of each other are equal (the API stores seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.discovery.slices import (
    API_VERSION,
    Content,
    DesiredPool,
    Owner,
    fingerprint,
    generate_name,
    normalize,
    slice_index,
)

__all__ = ["Adopted", "Plan", "plan", "same_spec"]

Obj = dict[str, Any]
Adopted = Mapping[str, tuple[str, str]]


def same_spec(actual: Obj, desired_spec: Obj, *, adopted: Adopted | None = None) -> bool:
    """Whether the existing slice already says what `desired_spec` says.

    `adopted` maps a slice name to (what we sent, what the server stored) when the server
    changed the object on write (fields dropped by a disabled gate, server-set values); the
    stored form then counts as the desired one, which avoids an update loop.
    """
    actual_spec = actual.get("spec") or {}
    if normalize(actual_spec) == normalize(_with_time_added(desired_spec, actual_spec)):
        return True
    name = actual.get("metadata", {}).get("name", "")
    remembered = (adopted or {}).get(name)
    return remembered == (fingerprint(desired_spec), fingerprint(actual_spec))


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None


def _same_time(desired: Any, actual: Any) -> bool:
    """Whether two `timeAdded` values are within a second of each other."""
    a, b = _parse_time(desired), _parse_time(actual)
    return a is not None and b is not None and abs((a - b).total_seconds()) <= 1


def _taint_id(taint: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return taint.get("key"), taint.get("value", ""), taint.get("effect")


def _with_time_added(desired_spec: Obj, actual_spec: Obj) -> Obj:
    """The desired spec with the existing `timeAdded` of taints that did not change.

    A desired taint without `timeAdded`, or with one within a second of the existing one,
    takes the existing slice's (so an update never resets an eviction clock).
    """
    actual_devices = {d.get("name"): d for d in actual_spec.get("devices") or []}
    devices = []
    for device in desired_spec.get("devices") or []:
        old = {
            _taint_id(t): t.get("timeAdded")
            for t in (actual_devices.get(device["name"]) or {}).get("taints") or []
            if t.get("timeAdded")
        }
        if not device.get("taints") or not old:
            devices.append(device)
            continue
        taints = []
        for taint in device["taints"]:
            existing = old.get(_taint_id(taint))
            wanted = taint.get("timeAdded")
            if existing is not None and (wanted is None or _same_time(wanted, existing)):
                taint = {**taint, "timeAdded": existing}
            taints.append(taint)
        devices.append({**device, "taints": taints})
    return {**desired_spec, "devices": devices} if "devices" in desired_spec else desired_spec


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Writes that make the actual slices the desired ones: delete, then update, then create."""

    generation: int
    deletes: tuple[Obj, ...] = ()
    updates: tuple[Obj, ...] = ()
    creates: tuple[Obj, ...] = ()
    changed: bool = False
    """Whether the content of the pool changed (some slice is updated or created)."""
    bumped: bool = False
    """Whether the generation was bumped (and then every slice of the pool is rewritten)."""

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.updates or self.creates)


@dataclass(slots=True)
class _Matching:
    pairs: list[tuple[Obj, Content]] = field(default_factory=list)
    missing: list[tuple[int, Content]] = field(default_factory=list)
    """Contents no slice is left for, with their index in the pool."""
    extra: list[Obj] = field(default_factory=list)


def _key(content_or_spec: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    devices = frozenset(d.get("name", "") for d in content_or_spec.get("devices") or [])
    sets = frozenset(c.get("name", "") for c in content_or_spec.get("sharedCounters") or [])
    return devices, sets


def _take(unused: list[Obj], wanted: Callable[[Obj], bool]) -> Obj | None:
    """Remove and return the first slice of `unused` that `wanted` accepts."""
    found = next((s for s in unused if wanted(s)), None)
    if found is not None:
        unused.remove(found)
    return found


def _match(existing: list[Obj], contents: Sequence[Content], *, driver: str) -> _Matching:
    """Pair slices with contents: same names inside, then the same index prefix, then in order."""
    matching = _Matching()
    unused = list(existing)
    rules: list[Callable[[int, Content], Callable[[Obj], bool]]] = [
        lambda _, content: lambda s: _key(s.get("spec") or {}) == _key(content),
        lambda index, _: lambda s: slice_index(_name(s), driver=driver) == index,
        lambda _, __: lambda s: True,
    ]
    unpaired = list(enumerate(contents))
    for rule in rules:
        left: list[tuple[int, Content]] = []
        for index, content in unpaired:
            found = _take(unused, rule(index, content))
            if found is None:
                left.append((index, content))
            else:
                matching.pairs.append((found, content))
        unpaired = left
    matching.missing = unpaired
    matching.extra = unused
    return matching


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _name(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def plan(
    want: DesiredPool,
    actual: Sequence[Obj],
    *,
    owner: Owner,
    adopted: Adopted | None = None,
    floor: int = 0,
) -> Plan:
    """The writes that make `actual` (this driver's slices on this node) match `want`.

    Slices of an older generation, of another pool, or left over (more than desired) are
    obsolete and deleted first. The generation is kept when no slice is created and at
    most one changes; otherwise it is bumped and every slice is rewritten, reusing existing
    objects (obsolete ones too) where it can. `floor` is the highest generation published
    before (slices since deleted, e.g. by the kubelet), so that a re-created pool never goes
    back to an older generation.
    """
    ours = sorted((s for s in actual if _pool_name(s) == want.pool), key=_name)
    others = [s for s in actual if _pool_name(s) != want.pool]
    generation = max((_generation(s) for s in ours), default=0)
    current = [s for s in ours if _generation(s) == generation]
    stale = [s for s in ours if _generation(s) != generation]
    matching = _match(current, want.contents, driver=want.driver)
    changed = [
        (s, c)
        for s, c in matching.pairs
        if not same_spec(s, want.spec(c, generation=generation), adopted=adopted)
    ]
    if not matching.missing and len(changed) <= 1 and floor <= generation:
        return Plan(
            generation=generation,
            deletes=tuple(others + stale + matching.extra),
            updates=tuple(
                _replaced(s, want.spec(c, generation=generation), owner=owner) for s, c in changed
            ),
            changed=bool(changed),
        )
    bumped = max(generation, floor) + 1
    matching = _match(current + stale, want.contents, driver=want.driver)
    updates = tuple(
        _replaced(s, want.spec(c, generation=bumped), owner=owner) for s, c in matching.pairs
    )
    creates = tuple(
        _new_slice(want, want.spec(c, generation=bumped), owner=owner, index=i)
        for i, c in matching.missing
    )
    return Plan(
        generation=bumped,
        deletes=tuple(others + matching.extra),
        updates=updates,
        creates=creates,
        changed=True,
        bumped=True,
    )


def _pool_name(obj: Obj) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


def _new_slice(want: DesiredPool, spec: Obj, *, owner: Owner, index: int) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": generate_name(
                want.node, want.driver, index=index, count=len(want.contents)
            ),
            "ownerReferences": [owner.reference()],
        },
        "spec": spec,
    }


def _replaced(existing: Obj, spec: Obj, *, owner: Owner) -> Obj:
    """The existing object (same name and resourceVersion, for optimistic locking) with `spec`.

    Taints that stay keep their `timeAdded`, as the Go helper's `copyTaintTimeAdded` does.
    """
    metadata = dict(existing.get("metadata") or {})
    metadata["ownerReferences"] = [owner.reference()]
    spec = _with_time_added(spec, existing.get("spec") or {})
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
