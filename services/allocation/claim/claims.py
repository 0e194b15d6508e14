"""A ResourceClaim as this plugin sees it: the allocation results for our driver and our pool.

`select()` is pure (claim object in, `AllocatedClaim` out); `ClaimReader` GETs the claim through
any `KubeReader` (the shared KubeClient in production, the API emulator in tests). Nothing here
writes to the API server or touches devices.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from services.allocation.claim import echo, nesting, node_selector
from shared import backoff, quantity
from shared.errors import (
    ClaimError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimUIDMismatchError,
    DeviceNotAllocatableError,
    KubeError,
    KubeNotFoundError,
    RecoverableError,
)
from shared.kube.resources import RESOURCE_CLAIMS, ResourceType

__all__ = [
    "POD_CLAIM_NAME_ANNOTATION",
    "AllocatedClaim",
    "ClaimReader",
    "ClaimRef",
    "DeviceResult",
    "KubeReader",
    "OpaqueConfig",
    "PodRef",
    "base_request",
    "reserved_pods",
    "select",
]

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
_ALLOCATION = "status.allocation"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set by the resourceclaim controller on a claim it made from a pod's template."""
_MAX_QUANTITY = 2**63 - 1  # Kubernetes quantities beyond int64 are not device sizes
_DEVICES = f"{_ALLOCATION}.devices"
# IsDNS1123Label (namespaces) and IsDNS1123Subdomain (names), as kube-apiserver checks them.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet passes for a claim: enough to GET it, and the UID it must still have."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        # Clipped: the kubelet's names reach us unchecked and end up in errors and logs.
        return f"{echo.clip(self.namespace, 63)}/{echo.clip(self.name)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceResult:
    """One allocation result of our driver on our pool."""

    request: str
    """The base request name (`a/b` is reduced to `a`): what containers can reference."""
    request_ref: str = ""
    """The request as allocated (`a/b` for a subrequest); empty when it is `request`."""
    pool: str
    device: str
    share_id: str | None = None
    admin_access: bool = False
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    """`consumedCapacity` of a share of a multi-allocatable device (docs/contracts.md §4.4): what
    the
    container may use of the device; empty for a device allocated whole."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpaqueConfig:
    """An opaque configuration entry for our driver, in the order drivers must apply them."""

    source: str
    """`FromClass` or `FromClaim`; class configs come first so claim configs override them."""
    requests: tuple[str, ...]
    """Request names it applies to (`req` or `req/sub`); empty means every request."""
    parameters: Obj

    def applies_to(self, request: str) -> bool:
        return not self.requests or any(base_request(r) == request for r in self.requests)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatedClaim:
    ref: ClaimRef
    results: tuple[DeviceResult, ...]
    configs: tuple[OpaqueConfig, ...] = ()
    pods: tuple[PodRef, ...] = ()
    """The pods the claim is reserved for (`status.reservedFor`), when it was read."""
    pod_claim_name: str | None = None
    """`resource.kubernetes.io/pod-claim-name`: the pod's name for a claim from a template."""
    resource: Obj | None = field(default=None, compare=False, repr=False)
    """The claim object as read (with its resourceVersion): the claim's status write after the
    prepare starts from it instead of reading the claim once more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    """A pod a claim is reserved for; pods live in the claim's namespace."""

    namespace: str
    name: str
    uid: str


def reserved_pods(claim: Obj, *, namespace: str) -> tuple[PodRef, ...]:
    """The pods of `status.reservedFor` (entries of core resource `pods`), once each (pure).

    Informational only (which pods use a prepared claim), so an entry of an unexpected shape is
    skipped rather than failing the claim."""
    status = claim.get("status")
    reserved = status.get("reservedFor") if isinstance(status, Mapping) else None
    pods: dict[str, PodRef] = {}
    for entry in reserved if isinstance(reserved, list) else ():
        if not isinstance(entry, Mapping) or entry.get("resource") != "pods":
            continue
        name, uid = entry.get("name"), entry.get("uid", "")
        if entry.get("apiGroup", "") or not isinstance(name, str) or not isinstance(uid, str):
            continue
        if _NAME.fullmatch(name):
            pods.setdefault(name, PodRef(namespace=namespace, name=name, uid=uid[:64]))
    return tuple(pods.values())


class KubeReader(Protocol):
    """The one call this module needs from a Kubernetes client."""

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Obj: ...


def base_request(name: str) -> str:
    """`req/sub` -> `req`: the kubelet matches containers against top-level requests only."""
    return name.split("/", 1)[0]


def select(claim: Obj, *, ref: ClaimRef, driver: str, pool: str, node: str) -> AllocatedClaim:
    """Keep what `driver` must prepare on `pool` of `node` out of the ResourceClaim `claim`.

    A result of `driver` on another pool is another node's device, and an allocation whose
    `nodeSelector` does not select `node` was made for another node: either fails the claim
    rather than preparing it here. An allocation of an unexpected shape (one the API server
    would not accept) fails the claim with the path of the offending field.
    """
    uid = claim.get("metadata", {}).get("uid", "")
    if uid != ref.uid:
        raise ClaimUIDMismatchError(
            f"claim {ref} got replaced: uid {uid!r}, expected {ref.uid!r}", claim_uid=ref.uid
        )
    shape = _Shape(ref)
    allocation = shape.mapping(claim.get("status"), "status").get("allocation")
    if not allocation:
        raise ClaimNotAllocatedError(f"claim {ref}: not allocated", claim_uid=ref.uid)
    allocation = shape.mapping(allocation, _ALLOCATION)
    if (why := node_selector.mismatch(allocation.get("nodeSelector"), node=node)) is not None:
        raise ClaimError(f"claim {ref}: {_ALLOCATION}.{why}", claim_uid=ref.uid)
    devices = shape.mapping(shape.mapping(allocation, _ALLOCATION).get("devices"), _DEVICES)
    results = []
    for index, raw in enumerate(shape.sequence(devices.get("results"), f"{_DEVICES}.results")):
        path = f"{_DEVICES}.results[{index}]"
        if shape.mapping(raw, path).get("driver") == driver:
            results.append(_result(shape, raw, path, driver=driver, pool=pool))
    configs = _configs(shape, devices, driver=driver)
    pods = reserved_pods(claim, namespace=ref.namespace)
    return AllocatedClaim(
        ref=ref,
        results=tuple(results),
        configs=configs,
        pods=pods,
        pod_claim_name=_pod_claim_name(shape, claim),
        resource=claim,
    )


def _pod_claim_name(shape: _Shape, claim: Obj) -> str | None:
    metadata = shape.mapping(claim.get("metadata"), "metadata")
    annotations = shape.mapping(metadata.get("annotations"), "metadata.annotations")
    path = f"metadata.annotations[{POD_CLAIM_NAME_ANNOTATION}]"
    return shape.string(annotations.get(POD_CLAIM_NAME_ANNOTATION), path) or None


class _Shape:
    """Type checks on the allocation of one claim; a wrong type fails that claim."""

    def __init__(self, ref: ClaimRef) -> None:
        self.ref = ref

    def fail(self, path: str, expected: str, value: Any) -> ClaimError:
        return ClaimError(
            f"claim {self.ref}: {path}: expected {expected}, got {type(value).__name__}",
            claim_uid=self.ref.uid,
        )

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(path, "an object", value)
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, "a list", value)
        return value

    def string(self, value: Any, path: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(path, "a string", value)
        return value

    def amount(self, value: Any, path: str) -> str:
        """A quantity as written; one beyond int64 is refused (it could not be printed)."""
        text = self.string(value, path)
        try:
            number = quantity.parse(text)
        except quantity.QuantityError:
            return text
        if number > _MAX_QUANTITY:
            raise ClaimError(
                f"claim {self.ref}: {path}: {text[:20]}... is larger than any device",
                claim_uid=self.ref.uid,
            )
        return text


def _result(shape: _Shape, raw: Any, path: str, *, driver: str, pool: str) -> DeviceResult:
    result = shape.mapping(raw, path)
    device = shape.string(result.get("device"), f"{path}.device")
    result_pool = shape.string(result.get("pool"), f"{path}.pool")
    if result_pool != pool:
        raise DeviceNotAllocatableError(
            f"claim {shape.ref}: device {device!r} of {driver} is in pool {result_pool!r}, "
            f"not on this node (pool {pool!r})",
            claim_uid=shape.ref.uid,
            device=device,
        )
    capacity = shape.mapping(result.get("consumedCapacity"), f"{path}.consumedCapacity")
    consumed = {
        str(name): shape.amount(amount, f"{path}.consumedCapacity.{name}")
        for name, amount in capacity.items()
    }
    request = shape.string(result.get("request"), f"{path}.request")
    return DeviceResult(
        request=base_request(request),
        request_ref=request if base_request(request) != request else "",
        pool=pool,
        device=device,
        share_id=shape.string(result.get("shareID"), f"{path}.shareID") or None,
        admin_access=bool(result.get("adminAccess")),
        consumed_capacity=consumed,
    )


def _configs(shape: _Shape, devices: Mapping[str, Any], *, driver: str) -> tuple[OpaqueConfig, ...]:
    ours = []
    for index, raw in enumerate(shape.sequence(devices.get("config"), f"{_DEVICES}.config")):
        path = f"{_DEVICES}.config[{index}]"
        entry = shape.mapping(raw, path)
        opaque = shape.mapping(entry.get("opaque"), f"{path}.opaque")
        if opaque.get("driver") != driver:
            continue
        requests = shape.sequence(entry.get("requests"), f"{path}.requests")
        ours.append(
            OpaqueConfig(
                source=shape.string(entry.get("source"), f"{path}.source"),
                requests=tuple(
                    shape.string(r, f"{path}.requests[{i}]") for i, r in enumerate(requests)
                ),
                parameters=dict(
                    shape.mapping(opaque.get("parameters"), f"{path}.opaque.parameters")
                ),
            )
        )
    # Stable sort: class configs first, claim configs after, each in list order.
    return tuple(sorted(ours, key=lambda c: c.source != "FromClass"))


READ_RETRY_AFTER_CAP_S = 2.0
"""The longest a 429's Retry-After holds back the next GET of a claim being prepared."""


class ClaimReader:
    """GETs claims and selects their results; API failures become this claim's error."""

    def __init__(
        self,
        kube: KubeReader,
        *,
        driver: str,
        pool: str,
        node: str | None = None,
        attempts: int = 3,
    ) -> None:
        """`node`: this node's name, which an allocation's nodeSelector must select; None when
        the pool is named after the node (the default pool)."""
        self._kube = kube
        self._driver = driver
        self._pool = pool
        self._node = pool if node is None else node
        self._attempts = attempts
        self._jitter = random.Random()  # one per read would seed from urandom each time

    async def read(self, ref: ClaimRef, *, deadline: float | None = None) -> AllocatedClaim:
        """The claim's results for us; with a `deadline` (event loop time) the read ends by
        then: a wait that would pass it, or a GET still running at it, fails the claim."""
        _check_names(ref)
        delays = backoff.Backoff(
            initial_s=0.2, max_s=2.0, rng=self._jitter, max_retry_after_s=READ_RETRY_AFTER_CAP_S
        )
        try:
            async with asyncio.timeout_at(deadline):
                claim = await backoff.retry(
                    lambda: self._kube.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace),
                    what=f"get resourceclaim {ref}",
                    backoff=delays,
                    attempts=self._attempts,
                    deadline=deadline,
                )
        except TimeoutError as exc:
            raise ClaimError(
                f"claim {ref}: reading it did not finish within the call's time budget",
                claim_uid=ref.uid,
            ) from exc
        except KubeNotFoundError as exc:
            raise ClaimNotFoundError(f"claim {ref}: not found", claim_uid=ref.uid) from exc
        except (KubeError, RecoverableError) as exc:
            # The kubelet retries a failed prepare; a failed batch call would fail every claim.
            raise ClaimError(f"claim {ref}: reading it failed: {exc}", claim_uid=ref.uid) from exc
        if nesting.depth(claim, limit=nesting.MAX_CLAIM_DEPTH) > nesting.MAX_CLAIM_DEPTH:
            # Before anything walks it recursively (a validator, repr in an error message).
            raise ClaimError(
                f"claim {ref}: nested deeper than {nesting.MAX_CLAIM_DEPTH} levels",
                claim_uid=ref.uid,
            )
        return select(claim, ref=ref, driver=self._driver, pool=self._pool, node=self._node)


def _check_names(ref: ClaimRef) -> None:
    """The kubelet's namespace and name go into the GET's path: only valid names may."""
    if not _NAMESPACE.fullmatch(ref.namespace):
        raise ClaimError(
            f"claim {ref}: malformed namespace {echo.clip(ref.namespace, 63)!r} (not a DNS label)",
            claim_uid=ref.uid,
        )
    if not _NAME.fullmatch(ref.name):
        raise ClaimError(
            f"claim {ref}: malformed name {echo.clip(ref.name)!r} (not a DNS subdomain)",
            claim_uid=ref.uid,
        )
