"""Fuzzing the allocation agent's kubelet surface: NodePrepareResources and
NodeUnprepareResources on DRA v1 and v1beta1, over the real unix socket, real agent.

Each example sends one batch mixing good claims with bad ones (garbage references, claims the
API does not have, replaced or unallocated claims, unknown devices, other nodes' devices, other
drivers' results, invalid opaque configs, allocations the API server would never hand out,
repeated and conflicting UIDs), then unprepares everything, and checks that:

- the answer has an entry for every requested UID and for nothing else;
- a bad claim's error is non-empty and names the problem (device, field or claim);
- the good claims beside bad ones are prepared, with exactly their devices;
- afterwards no checkpoint record, CDI spec or asyncio task is left over.

Raw bytes that are not a request get a gRPC status error, and the agent then still prepares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from devcluster.kubelet import KubeletEmulator
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import safe_uid
from services.allocation.dra.agent import AllocationAgent
from shared.pb.kubelet.dra.v1 import api_pb2 as v1
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as v1_grpc
from shared.pb.kubelet.dra.v1beta1 import api_pb2 as v1beta1
from shared.pb.kubelet.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from tests.integration.allocation.conftest import DRIVER, NODE, PluginNode
from tests.integration.fuzz.fuzzing import (
    dns_labels,
    fuzz_settings,
    garbage_bytes,
    garbage_text,
    json_values,
    no_new_tasks,
    settled_tasks,
)

pytestmark = pytest.mark.integration

DEVICES = ("npu-0", "npu-1", "npu-2", "npu-3")
OTHER_DRIVER = "other.example.com"
API_VERSION = f"{DRIVER}/v1alpha1"
VERSIONS = ("v1", "v1beta1")
_names = iter(range(1, 1_000_000))


# --- What a batch is made of -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Good:
    devices: tuple[str, ...]
    parameters: dict[str, Any] | None = None
    with_other_driver: bool = False


@dataclasses.dataclass(frozen=True)
class Repeat:
    """The same claim again (an earlier Good of the batch)."""

    of: int


@dataclasses.dataclass(frozen=True)
class Impostor:
    """An earlier Good's UID under another name."""

    of: int


@dataclasses.dataclass(frozen=True)
class Garbage:
    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class Missing:
    uid: str


@dataclasses.dataclass(frozen=True)
class Replaced:
    uid: str


@dataclasses.dataclass(frozen=True)
class Unallocated:
    pass


@dataclasses.dataclass(frozen=True)
class UnknownDevice:
    device: str


@dataclasses.dataclass(frozen=True)
class OtherNode:
    pool: str
    device: str


@dataclasses.dataclass(frozen=True)
class OtherDriverOnly:
    pass


@dataclasses.dataclass(frozen=True)
class BadConfig:
    parameters: dict[str, Any]
    field: str
    """What the error must name: the field's path (or the unknown key)."""


@dataclasses.dataclass(frozen=True)
class Malformed:
    """An allocation the API server rejects, put straight into its store (version skew)."""

    devices: Any
    field: str


Part = (
    Good
    | Repeat
    | Impostor
    | Garbage
    | Missing
    | Replaced
    | Unallocated
    | UnknownDevice
    | OtherNode
    | OtherDriverOnly
    | BadConfig
    | Malformed
)


def _valid_parameters() -> st.SearchStrategy[dict[str, Any] | None]:
    sharing = st.sampled_from(
        [
            {"strategy": "Exclusive"},
            {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}},
            {"strategy": "SpacePartitioning", "spacePartitioning": {"computePercent": 50}},
            {"strategy": "SpacePartitioning", "spacePartitioning": {"memoryLimit": "10Gi"}},
        ]
    )
    document = sharing.map(
        lambda block: {"apiVersion": API_VERSION, "kind": "DeviceConfig", "sharing": block}
    )
    return st.none() | document


def _not(valid: Any) -> Any:
    """JSON values other than `valid` ones (a predicate) and null (the API server drops it)."""
    return json_values().filter(lambda value: value is not None and not valid(value))


def _bad_configs() -> st.SearchStrategy[BadConfig]:
    base = {"apiVersion": API_VERSION, "kind": "DeviceConfig"}
    known = {"apiVersion", "kind", "sharing", "partition"}
    space = "sharing.spacePartitioning"

    def percent_ok(value: Any) -> bool:
        return type(value) is int and 1 <= value <= 100

    def spaced(block: dict[str, Any]) -> dict[str, Any]:
        return {**base, "sharing": {"strategy": "SpacePartitioning", "spacePartitioning": block}}

    return st.one_of(
        st.text(min_size=1, max_size=12)
        .filter(lambda key: key not in known)
        .map(lambda key: BadConfig({**base, key: 1}, key)),
        _not(lambda v: v == API_VERSION).map(
            lambda v: BadConfig({**base, "apiVersion": v}, "apiVersion")
        ),
        _not(lambda v: v == "DeviceConfig").map(lambda v: BadConfig({**base, "kind": v}, "kind")),
        _not(lambda v: isinstance(v, dict)).map(
            lambda v: BadConfig({**base, "sharing": v}, "sharing")
        ),
        _not(lambda v: v in ("Exclusive", "TimeSlicing", "SpacePartitioning")).map(
            lambda v: BadConfig({**base, "sharing": {"strategy": v}}, "sharing.strategy")
        ),
        _not(lambda v: v in ("Default", "Short", "Medium", "Long")).map(
            lambda v: BadConfig(
                {**base, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": v}}},
                "sharing.timeSlicing.interval",
            )
        ),
        _not(lambda v: percent_ok(v) or v is None).map(
            lambda v: BadConfig(spaced({"computePercent": v}), f"{space}.computePercent")
        ),
        st.one_of(
            _not(lambda v: isinstance(v, str) or v is None),
            # Not quantities, or not positive ones (`1e3` and `99999999Ei` are quantities:
            # 1000 bytes, and the int64 cap, as Kubernetes reads them).
            st.sampled_from(["0", "-1", "-5Mi", "x", "", "Gi", "1.5.5", "1" + "0" * 5000]),
        ).map(lambda v: BadConfig(spaced({"memoryLimit": v}), f"{space}.memoryLimit")),
        _not(lambda v: isinstance(v, str) and re.fullmatch(_PROFILE, v) is not None).map(
            lambda v: BadConfig({**base, "partition": {"profile": v}}, "partition.profile")
        ),
        st.text(min_size=1, max_size=12)
        .filter(lambda key: key not in ("strategy", "timeSlicing", "spacePartitioning"))
        .map(lambda key: BadConfig({**base, "sharing": {key: 1}}, f"sharing.{key}")),
    )


def _malformed() -> st.SearchStrategy[Malformed]:
    ours = {"request": "npu", "driver": DRIVER, "pool": NODE, "device": "npu-0"}
    path = "status.allocation.devices"

    def configured(*, parameters: Any = None, requests: Any = None) -> dict[str, Any]:
        opaque = {"driver": DRIVER, "parameters": parameters}
        config = {"source": "FromClaim", "requests": requests, "opaque": opaque}
        return {"results": [ours], "config": [config]}

    return st.one_of(
        _not(lambda v: isinstance(v, dict | list) or v is None).map(
            lambda v: Malformed({"results": v}, f"{path}.results")
        ),
        _not(lambda v: isinstance(v, dict) or v is None).map(
            lambda v: Malformed({"results": [ours, v]}, f"{path}.results[1]")
        ),
        _not(lambda v: isinstance(v, str) or v is None).map(
            lambda v: Malformed({"results": [{**ours, "device": v}]}, f"{path}.results[0].device")
        ),
        _not(lambda v: isinstance(v, dict) or v is None).map(
            lambda v: Malformed(
                {"results": [{**ours, "consumedCapacity": v}]},
                f"{path}.results[0].consumedCapacity",
            )
        ),
        _not(lambda v: isinstance(v, dict) or v is None).map(
            lambda v: Malformed(configured(parameters=v), f"{path}.config[0].opaque.parameters")
        ),
        _not(lambda v: isinstance(v, list) or v is None).map(
            lambda v: Malformed(configured(requests=v), f"{path}.config[0].requests")
        ),
    )


def _bad_parts() -> st.SearchStrategy[Part]:
    uids = st.uuids().map(str)
    return st.one_of(
        st.builds(Repeat, st.integers(0, 50)),
        st.builds(Impostor, st.integers(0, 50)),
        st.builds(Garbage, garbage_text(), garbage_text(), garbage_text() | uids),
        st.builds(Missing, uids),
        st.builds(Replaced, uids),
        st.just(Unallocated()),
        st.builds(UnknownDevice, dns_labels().filter(lambda d: d not in DEVICES)),
        st.builds(OtherNode, dns_labels().filter(lambda p: p != NODE), st.sampled_from(DEVICES)),
        st.just(OtherDriverOnly()),
        _bad_configs(),
        _malformed(),
    )


def _parts() -> st.SearchStrategy[Part]:
    device_sets = st.lists(st.sampled_from(DEVICES), min_size=1, max_size=3, unique=True)
    return (
        st.builds(Good, device_sets.map(tuple), _valid_parameters(), st.booleans()) | _bad_parts()
    )


# --- Turning parts into claims and expectations ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Expected:
    devices: tuple[str, ...] | None = None
    """The devices of a claim that must be prepared; None when it must fail."""
    words: tuple[str, ...] = ()
    """What the error must contain."""


@dataclasses.dataclass
class Batch:
    claims: list[v1.Claim] = dataclasses.field(default_factory=list)
    expected: dict[str, Expected] = dataclasses.field(default_factory=dict)


def _claim(namespace: str, name: str, uid: str) -> v1.Claim:
    return v1.Claim(namespace=namespace, name=name, uid=uid)


def _name() -> str:
    return f"fz-{next(_names)}"


def _results(devices: Sequence[str], *, driver: str = DRIVER, pool: str = NODE) -> list[Any]:
    return [{"request": "npu", "driver": driver, "pool": pool, "device": d} for d in devices]


class Builder:
    """Creates the API objects of a batch and says what the agent must answer for each."""

    def __init__(self, node: PluginNode) -> None:
        self.node = node
        self.api = node.api
        self.storage = node.api.registry.for_plural("resourceclaims")

    def claim_with(self, results: list[Any], *, config: list[Any] | None = None) -> v1.Claim:
        """A claim whose allocation the API server validated."""
        created = self.node.allocate(_name(), [], allocated=False)
        stored = self.api.get_object("resourceclaims", created.name, "default")
        assert stored is not None
        devices: dict[str, Any] = {"results": results}
        if config is not None:
            devices["config"] = config
        stored["status"] = {"allocation": {"devices": devices}}
        self.api.update_object(stored, status=True)
        return _claim("default", created.name, created.uid)

    def forced(self, devices: Any) -> v1.Claim:
        """A claim whose allocation went into the store without validation."""
        created = self.node.allocate(_name(), ["npu-0"])
        assert self.storage is not None
        stored = self.api.store.get(self.storage.storage, "default", created.name)
        assert stored is not None
        stored["status"] = {"allocation": {"devices": devices}}
        self.api.store.put(self.storage.storage, stored, event_type="MODIFIED")
        return _claim("default", created.name, created.uid)

    def build(self, parts: Sequence[Part], *, shuffle: random.Random | None = None) -> Batch:
        batch = Batch()
        goods: list[tuple[v1.Claim, Expected]] = []
        for part in sorted(parts, key=lambda p: not isinstance(p, Good)):
            made = self._make(part, goods)
            if made is None:
                continue
            claim, expected = made
            if isinstance(part, Good):
                goods.append((claim, expected))
            batch.claims.append(claim)
            batch.expected.setdefault(claim.uid, expected)
        if shuffle is not None:
            shuffle.shuffle(batch.claims)
        names: dict[str, set[tuple[str, str]]] = {}
        for claim in batch.claims:
            names.setdefault(claim.uid, set()).add((claim.namespace, claim.name))
        for uid, named in names.items():
            if len(named) > 1:
                batch.expected[uid] = Expected(words=("is also given to claim", uid))
        return batch

    def _make(
        self, part: Part, goods: list[tuple[v1.Claim, Expected]]
    ) -> tuple[v1.Claim, Expected] | None:
        match part:
            case Good(devices, parameters, with_other_driver):
                results = _results(devices)
                if with_other_driver:
                    results += _results(["gpu-9"], driver=OTHER_DRIVER)
                config = None
                if parameters is not None:
                    opaque = {"driver": DRIVER, "parameters": parameters}
                    config = [{"source": "FromClaim", "requests": [], "opaque": opaque}]
                return self.claim_with(results, config=config), Expected(devices=devices)
            case Repeat(of) | Impostor(of) if not goods:
                return None
            case Repeat(of):
                return goods[of % len(goods)]
            case Impostor(of):
                original, _ = goods[of % len(goods)]
                return _claim("default", _name(), original.uid), Expected()
            case Garbage(namespace, name, uid):
                return _claim(namespace, name, uid), Expected(words=(_garbage_problem(part),))
            case Missing(uid):
                name = _name()
                return _claim("default", name, uid), Expected(words=("not found", name))
            case Replaced(uid):
                created = self.node.allocate(_name(), ["npu-0"])
                return _claim("default", created.name, uid), Expected(words=("got replaced",))
            case Unallocated():
                created = self.node.allocate(_name(), ["npu-0"], allocated=False)
                claim = _claim("default", created.name, created.uid)
                return claim, Expected(words=("not allocated",))
            case UnknownDevice(device):
                claim = self.claim_with(_results(["npu-0", device]))
                return claim, Expected(words=(device, "not in the inventory"))
            case OtherNode(pool, device):
                claim = self.claim_with(_results(["npu-1"]) + _results([device], pool=pool))
                return claim, Expected(words=(device, pool, "not on this node"))
            case OtherDriverOnly():
                claim = self.claim_with(_results(["gpu-0"], driver=OTHER_DRIVER))
                return claim, Expected(devices=())
            case BadConfig(parameters, field):
                opaque = {"driver": DRIVER, "parameters": parameters}
                config = [{"source": "FromClaim", "requests": [], "opaque": opaque}]
                claim = self.claim_with(_results(["npu-2"]), config=config)
                return claim, Expected(words=(field, "invalid opaque config"))
            case Malformed(devices, field):
                return self.forced(devices), Expected(words=(field,))
        raise AssertionError(f"unknown part {part!r}")


_PROFILE = r"[A-Za-z0-9]([A-Za-z0-9._+-]{0,61}[A-Za-z0-9])?"
_NAMESPACE = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def _garbage_problem(part: Garbage) -> str:
    """What the agent must complain about first: the UID, the namespace, the name, or absence."""
    if not safe_uid(part.uid):
        return "malformed uid"
    if not re.fullmatch(_NAMESPACE, part.namespace):
        return "malformed namespace"
    if len(part.name) > 253 or not re.fullmatch(rf"{_LABEL}(\.{_LABEL})*", part.name):
        return "malformed name"
    return "not found"


# --- The agent, its socket and what it left behind ---------------------------------------


class Served:
    """The running agent, registered with a kubelet emulator, and the tasks it runs when idle."""

    def __init__(self, node: PluginNode, agent: AllocationAgent, kubelet: KubeletEmulator) -> None:
        self.node = node
        self.agent = agent
        self.kubelet = kubelet
        self.baseline: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return "Served()"

    async def reset(self) -> None:
        """Unprepare what an earlier (failed) example left, so that examples stay independent."""
        left = [_claim(r.namespace, r.name, r.uid) for r in self.agent.checkpoints.records()]
        if left:
            await self.unprepare(left, "v1")

    async def prepare(self, claims: Sequence[v1.Claim], version: str) -> dict[str, Any]:
        request = v1.NodePrepareResourcesRequest(claims=claims)
        if version == "v1":
            stub = v1_grpc.DRAPluginStub(self.kubelet.channel)
            answer = await stub.NodePrepareResources(request, timeout=30)
        else:
            beta = v1beta1.NodePrepareResourcesRequest.FromString(request.SerializeToString())
            stub_beta = v1beta1_grpc.DRAPluginStub(self.kubelet.channel)
            raw = await stub_beta.NodePrepareResources(beta, timeout=30)
            answer = v1.NodePrepareResourcesResponse.FromString(raw.SerializeToString())
        return dict(answer.claims)

    async def unprepare(self, claims: Sequence[v1.Claim], version: str) -> dict[str, str]:
        request = v1.NodeUnprepareResourcesRequest(claims=claims)
        if version == "v1":
            stub = v1_grpc.DRAPluginStub(self.kubelet.channel)
            answer = await stub.NodeUnprepareResources(request, timeout=30)
        else:
            beta = v1beta1.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
            stub_beta = v1beta1_grpc.DRAPluginStub(self.kubelet.channel)
            raw = await stub_beta.NodeUnprepareResources(beta, timeout=30)
            answer = v1.NodeUnprepareResourcesResponse.FromString(raw.SerializeToString())
        return {uid: entry.error for uid, entry in answer.claims.items()}

    def left_behind(self) -> tuple[list[str], list[str], list[str]]:
        """Checkpoint files, CDI spec files and in-memory records."""
        records = sorted(record.uid for record in self.agent.checkpoints.records())
        return self.node.checkpoint_files(), self.node.cdi_files(), records

    def expect_left(self, uids: set[str], with_specs: set[str]) -> None:
        assert self.left_behind() == (
            sorted(f"{uid}.json" for uid in uids),
            sorted(spec_files.spec_file_name(DRIVER, uid) for uid in with_specs),
            sorted(uids),
        )

    async def quiesced(self) -> None:
        """Nothing left: no files, no records, no extra tasks."""
        self.expect_left(set(), set())
        await no_new_tasks(self.baseline)


@pytest.fixture
async def served(plugin_node: PluginNode) -> AsyncIterator[Served]:
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.publish_inventory(*DEVICES)
        await plugin_node.eventually(
            lambda: (
                agent.inventory.current is not None
                and tuple(d.name for d in agent.inventory.current.devices) == DEVICES
            )
        )
        served = Served(plugin_node, agent, kubelet)
        for version in VERSIONS:  # every method once: gRPC starts a poller per method
            warm = plugin_node.allocate(f"warm-up-{version}", ["npu-0"])
            claim = _claim(warm.namespace, warm.name, warm.uid)
            assert (await served.prepare([claim], version))[warm.uid].error == ""
            assert (await served.unprepare([claim], version))[warm.uid] == ""
        served.baseline = await settled_tasks()
        yield served


# --- The properties ----------------------------------------------------------------------


def _check_prepared(batch: Batch, answer: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Assert each entry of `answer`; the UIDs prepared, and those of them with a CDI spec."""
    assert set(answer) == {claim.uid for claim in batch.claims}
    prepared, with_specs = set(), set()
    names = {claim.uid: claim.name for claim in batch.claims}
    for uid, entry in answer.items():
        expected = batch.expected[uid]
        if expected.devices is None:
            assert entry.error, f"claim {uid} must fail: {expected}"
            assert not entry.devices
            for word in expected.words:
                assert word in entry.error, f"{word!r} not in {entry.error!r}"
            # Names are clipped in errors (a 2 MiB name must not make a 4 MiB answer).
            assert uid in entry.error or names[uid][:200] in entry.error
            continue
        assert entry.error == "", f"claim {uid} must be prepared: {entry.error}"
        assert tuple(d.device_name for d in entry.devices) == expected.devices
        for device in entry.devices:
            assert device.pool_name == NODE
            assert list(device.request_names) == ["npu"]
            assert list(device.cdi_device_ids) == [f"k8s.{DRIVER}/claim={uid}-{device.device_name}"]
        prepared.add(uid)
        if expected.devices:
            with_specs.add(uid)
    return prepared, with_specs


@fuzz_settings(max_examples=60)
@given(
    parts=st.lists(_parts(), min_size=1, max_size=10),
    versions=st.tuples(st.sampled_from(VERSIONS), st.sampled_from(VERSIONS)),
    extra=st.lists(st.builds(_claim, garbage_text(), garbage_text(), garbage_text()), max_size=3),
    shuffle=st.randoms(),
)
async def test_every_claim_gets_its_own_answer_and_nothing_leaks(
    served: Served,
    parts: list[Part],
    versions: tuple[str, str],
    extra: list[v1.Claim],
    shuffle: random.Random,
) -> None:
    await served.reset()
    batch = Builder(served.node).build(parts, shuffle=shuffle)
    prepare_version, unprepare_version = versions

    answer = await served.prepare(batch.claims, prepare_version)
    prepared, with_specs = _check_prepared(batch, answer)
    served.expect_left(prepared, with_specs)
    assert await served.prepare(batch.claims, prepare_version) == answer  # idempotent

    # Unprepare everything, and some references that were never prepared.
    claims = batch.claims + extra
    errors = await served.unprepare(claims, unprepare_version)
    assert set(errors) == {claim.uid for claim in claims}
    for uid, error in errors.items():
        if safe_uid(uid):
            assert error == ""
        else:
            assert "malformed uid" in error
    await served.quiesced()


@fuzz_settings(max_examples=2)
@given(
    goods=st.integers(150, 250),
    bads=st.lists(_bad_parts(), min_size=30, max_size=60),
    version=st.sampled_from(VERSIONS),
)
async def test_hundreds_of_claims_in_one_request(
    served: Served, goods: int, bads: list[Part], version: str
) -> None:
    await served.reset()
    parts: list[Part] = [Good((DEVICES[i % 4],)) for i in range(goods)] + bads
    batch = Builder(served.node).build(parts)
    answer = await served.prepare(batch.claims, version)
    prepared, with_specs = _check_prepared(batch, answer)
    assert len(prepared) >= goods - sum(isinstance(p, Impostor) for p in bads)
    served.expect_left(prepared, with_specs)
    errors = await served.unprepare(batch.claims, version)
    assert set(errors) == {claim.uid for claim in batch.claims}
    await served.quiesced()


METHODS = [
    (f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}", request, response)
    for version, module in (("v1", v1), ("v1beta1", v1beta1))
    for method, request, response in (
        (
            "NodePrepareResources",
            module.NodePrepareResourcesRequest,
            module.NodePrepareResourcesResponse,
        ),
        (
            "NodeUnprepareResources",
            module.NodeUnprepareResourcesRequest,
            module.NodeUnprepareResourcesResponse,
        ),
    )
]


@fuzz_settings(max_examples=60)
@given(method=st.sampled_from(METHODS), data=garbage_bytes())
async def test_bytes_that_are_no_request_get_a_status_error(
    served: Served, method: tuple[str, Any, Any], data: bytes
) -> None:
    await served.reset()
    path, request_type, response_type = method
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = served.kubelet.channel.unary_unary(path)
    try:
        request = request_type.FromString(data)
    except DecodeError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(data, timeout=10)
        # The decode guard answers INVALID_ARGUMENT, naming the method and the parse error.
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert path in (caught.value.details() or "")
        assert "Error parsing message" in (caught.value.details() or "")
    else:
        # Bytes that happen to decode are a request like any other: one entry per UID.
        answer = response_type.FromString(await call(data, timeout=10))
        assert set(answer.claims) == {claim.uid for claim in request.claims}
        if "Prepare" in path and "Unprepare" not in path:
            assert all(entry.error for entry in answer.claims.values())
    # The agent serves the next good request.
    good = served.node.allocate(_name(), ["npu-3"])
    claim = _claim(good.namespace, good.name, good.uid)
    assert [d.device_name for d in (await served.prepare([claim], "v1"))[good.uid].devices] == [
        "npu-3"
    ]
    assert (await served.unprepare([claim], "v1"))[good.uid] == ""
    await served.quiesced()
