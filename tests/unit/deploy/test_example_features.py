"""The example claims the devcluster scheduler does not allocate on the sim slices as such:
prioritized fallbacks, GPU + NIC on one PCIe root, a MIG partition, admin access, capacity
requests, tolerations and opaque config; and the partition / vNPU / sharing DeviceClasses.
Selectors are evaluated with real CEL (celpy, through `devcluster.scheduler`)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster import scheduler
from services.allocation.claim import opaque
from services.discovery import inventory, slices
from services.health.policy import taint_key
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.parts.sysfs import Sysfs
from shared.vendors.sim.discovery import SimBackend
from tests.fakes.nvml import FakeNVML
from tests.unit.deploy.manifests import (
    _claim_spec,
    _example_objects,
    _overlay_classes,
)

NODE = "node-a"
SIM = "sim.dra-suite.io"
GPU = "gpu.dra-suite.io"
NIC_CLASS = {  # what the hypothetical NIC driver would install
    "metadata": {"name": "nic.example.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
}
MIG_PROFILES = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def _slice(driver: str, index: int, content: dict[str, Any]) -> dict[str, Any]:
    spec = {"driver": driver, "nodeName": NODE, "pool": {"name": NODE}, **content}
    return {"metadata": {"name": f"{NODE}-{driver}-{index}"}, "spec": spec}


def _pool(scan: Any, *, driver: str, backend: str) -> list[dict[str, Any]]:
    identity = inventory.Identity(driver=driver, node=NODE, pool=NODE, backend=backend)
    pool = slices.desired(inventory.build(scan, identity=identity, scanned_unix_ms=0))
    assert not pool.rejected
    return [_slice(driver, i, content) for i, content in enumerate(pool.contents)]


async def _sim_slices(profile: str = "mixed") -> list[dict[str, Any]]:
    return _pool(await SimBackend.from_profile(profile).scan(), driver=SIM, backend="sim")


async def _nvml_slices(sysfs_root: Path) -> list[dict[str, Any]]:
    fake = FakeNVML.node("H100-80GB", count=2, mig_enabled=True)
    fake.populate_sysfs(sysfs_root)
    backend = nvml.NvmlBackend.open(
        fake, options=nvml.NvmlOptions(mig_profiles=MIG_PROFILES), sysfs=Sysfs(sysfs_root)
    )
    return _pool(await backend.scan(), driver=GPU, backend="nvml")


def _claim(name: str) -> dict[str, Any]:
    for doc in _example_objects():
        spec = _claim_spec(doc)
        if spec is not None and doc["metadata"]["name"] == name:
            return {"metadata": doc["metadata"], "spec": spec}
    raise AssertionError(f"no example claim {name}")


def _allocated(claim: dict[str, Any], classes: Any, slices_: Any) -> list[tuple[str, str]]:
    return [
        (r.request, r.device) for r in scheduler.allocate(claim, classes=classes, slices=slices_)
    ]


def _selected(expressions: list[str], slices_: list[dict[str, Any]]) -> list[str]:
    devices = scheduler.devices_of(slices_)
    return [d.name for d in devices if all(scheduler.matches(e, d) for e in expressions)]


def _class_selectors(device_class: dict[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]


# --- same card, else same ring, else anywhere ---------------------------------------------


def _edit_devices(slices_: list[dict[str, Any]], edit: Callable[[dict[str, Any]], None]) -> Any:
    edited = copy.deepcopy(slices_)
    for item in edited:
        for device in item["spec"].get("devices", []):
            edit(device)
    return edited


def _busy(*names: str) -> Callable[[dict[str, Any]], None]:
    """Devices taken (modelled as NoSchedule-tainted: the scheduler skips them)."""

    def edit(device: dict[str, Any]) -> None:
        if device["name"] in names:
            device["taints"] = [{"key": "example.com/busy", "effect": "NoSchedule"}]

    return edit


def _unchanged(device: dict[str, Any]) -> None:
    pass


FALLBACKS = [  # (sim profile, slice edit, the subrequest that is chosen, its devices)
    ("ascend-310p-duo", _unchanged, "same-card", ["npu-0", "npu-1"]),
    ("ascend-310p-duo", _busy("npu-0", "npu-3"), "same-card", ["npu-4", "npu-5"]),
    ("ascend-310p-duo", _busy("npu-0", "npu-3", "npu-5", "npu-7"), "anywhere", ["npu-1", "npu-2"]),
    ("mixed", _unchanged, "same-ring", ["npu-0", "npu-1"]),
    (
        "mixed",
        _busy("npu-1", "npu-2", "npu-3", "npu-5", "npu-6", "npu-7"),
        "anywhere",
        ["npu-0", "npu-4"],
    ),
]
FALLBACK_IDS = [
    "both chips of a Duo card are taken as the same card",
    "a card with both chips free is found past half-used ones",
    "with no card whole (a Duo card is its own HCCS ring) any two chips are taken",
    "with one chip per card (910B) two NPUs of one HCCS ring are taken",
    "with one free NPU per ring any two NPUs are taken",
]


def _first_available(claim: dict[str, Any], classes: Any, slices_: Any) -> list[tuple[str, str]]:
    """firstAvailable as Kubernetes defines it: each subrequest in order, as a claim of its own
    whose constraints are those naming that subrequest; the first one that fits wins."""
    (request,) = claim["spec"]["devices"]["requests"]
    for sub in request["firstAvailable"]:
        scoped = f"{request['name']}/{sub['name']}"
        constraints = [
            {**c, "requests": [request["name"]]}
            for c in claim["spec"]["devices"].get("constraints", [])
            if scoped in c["requests"] or request["name"] in c["requests"]
        ]
        exact = {k: v for k, v in sub.items() if k != "name"}
        single = {"requests": [{"name": request["name"], "exactly": exact}]}
        try:
            picked = _allocated(
                {"spec": {"devices": {**single, "constraints": constraints}}}, classes, slices_
            )
        except scheduler.UnsatisfiableError:
            continue
        return [(scoped, device) for _, device in picked]
    raise scheduler.UnsatisfiableError("no subrequest fits")


@pytest.mark.parametrize(("profile", "edit", "chosen", "devices"), FALLBACKS, ids=FALLBACK_IDS)
async def test_card_ring_or_any_claim_falls_back_in_order(profile, edit, chosen, devices):
    slices_ = _edit_devices(await _sim_slices(profile), edit)
    claim = _claim("two-sim-npus-card-ring-any")
    got = _first_available(claim, _overlay_classes("sim"), slices_)
    assert got == [(f"npus/{chosen}", d) for d in devices]


@pytest.mark.parametrize(("profile", "edit", "chosen", "devices"), FALLBACKS, ids=FALLBACK_IDS)
async def test_devcluster_scheduler_honours_constraints_naming_a_subrequest(
    profile, edit, chosen, devices
):
    slices_ = _edit_devices(await _sim_slices(profile), edit)
    got = _allocated(_claim("two-sim-npus-card-ring-any"), _overlay_classes("sim"), slices_)
    assert got == [(f"npus/{chosen}", d) for d in devices]


# --- GPU + NIC on one PCIe root -----------------------------------------------------------


def _nic_slice(root: str) -> dict[str, Any]:
    device = {
        "name": "nic-0",
        "attributes": {
            "resource.kubernetes.io/pcieRoot": {"string": root},
            "type": {"string": "nic"},
        },
    }
    return _slice("nic.example.com", 0, {"devices": [device]})


async def test_gpu_with_nic_is_unsatisfiable_on_the_sim_node_for_want_of_a_nic():
    classes = {**_overlay_classes("sim"), "nic.example.com": NIC_CLASS}
    slices_ = await _sim_slices()
    assert _selected(_class_selectors(NIC_CLASS), slices_) == []  # the reason: no NIC at all
    with pytest.raises(scheduler.UnsatisfiableError, match="requests gpu, nic"):
        scheduler.allocate(_claim("gpu-with-nic"), classes=classes, slices=slices_)


@pytest.mark.parametrize(
    ("root", "gpu"),
    [("pci0000:c0", "gpu-2"), ("pci0000:40", "gpu-0")],
    ids=["a NIC on the second root pairs with the first GPU there", "a NIC on the first root"],
)
async def test_gpu_with_nic_takes_a_gpu_behind_the_nics_pcie_root(root, gpu):
    classes = {**_overlay_classes("sim"), "nic.example.com": NIC_CLASS}
    slices_ = [*await _sim_slices(), _nic_slice(root)]
    got = scheduler.allocate(_claim("gpu-with-nic"), classes=classes, slices=slices_)
    assert [(r.request, r.driver, r.device) for r in got] == [
        ("gpu", SIM, gpu),
        ("nic", "nic.example.com", "nic-0"),
    ]


async def test_gpu_with_nic_is_unsatisfiable_when_the_nic_shares_no_root_with_a_gpu():
    classes = {**_overlay_classes("sim"), "nic.example.com": NIC_CLASS}
    slices_ = [*await _sim_slices(), _nic_slice("pci0000:00")]  # the NPUs' root
    with pytest.raises(scheduler.UnsatisfiableError):
        scheduler.allocate(_claim("gpu-with-nic"), classes=classes, slices=slices_)


# --- static partition (nvidia overlay) ----------------------------------------------------


async def test_mig_claim_takes_the_first_1g_10gb_partition_of_a_fake_h100(tmp_path):
    got = _allocated(
        _claim("one-mig-1g-10gb"), _overlay_classes("nvidia"), await _nvml_slices(tmp_path)
    )
    assert got == [("mig", "gpu-0-mig-1g10gb-19-0")]


@pytest.mark.parametrize("profile", MIG_PROFILES)
async def test_mig_profile_class_selects_exactly_that_profiles_partitions(profile, tmp_path):
    slices_ = await _nvml_slices(tmp_path)
    device_class = _overlay_classes("nvidia")[f"mig-{profile}.gpu.dra-suite.io"]
    chosen = _selected(_class_selectors(device_class), slices_)
    canonical = re.sub(r"[^a-z0-9-]", "-", profile.replace(".", ""))
    assert chosen
    assert all(re.fullmatch(rf"gpu-[01]-mig-{canonical}-\d+-\d+", name) for name in chosen)


@pytest.mark.parametrize(
    ("device_class", "pattern"),
    [
        ("gpu.dra-suite.io", r"gpu-[01]"),
        ("timeslicing.gpu.dra-suite.io", r"gpu-[01]"),
        ("mig.gpu.dra-suite.io", r"gpu-[01]-mig-.*"),
    ],
    ids=["whole GPUs only", "time-sliced whole GPUs", "every MIG partition"],
)
async def test_nvidia_class_selects_whole_gpus_or_partitions(device_class, pattern, tmp_path):
    slices_ = await _nvml_slices(tmp_path)
    chosen = _selected(_class_selectors(_overlay_classes("nvidia")[device_class]), slices_)
    every = [d.name for d in scheduler.devices_of(slices_)]
    assert chosen == [name for name in every if re.fullmatch(pattern, name)]


# --- vNPU template classes (ascend overlay) -----------------------------------------------


def _npu(name: str, chip: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"chipName": {"string": chip}, "type": {"string": "npu"}}}


ASCEND_CHIPS = [  # device -> chip name as npu-smi reports it
    ("npu-0", "910B4"),
    ("npu-1", "910B4vir05_1c_8g"),
    ("npu-2", "910B4vir10_3c_16g"),
    ("npu-3", "310Pvir02"),
    ("npu-4", "310Pvir02_1c"),
    ("npu-5", "310Pvir04"),
]


@pytest.mark.parametrize(
    ("device_class", "selected"),
    [
        ("npu.huawei.com", [name for name, _ in ASCEND_CHIPS]),
        ("vir05-1c-8g.npu.huawei.com", ["npu-1"]),
        ("vir10-3c-16g.npu.huawei.com", ["npu-2"]),
        ("vir02.npu.huawei.com", ["npu-3"]),
        ("vir04.npu.huawei.com", ["npu-5"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_ascend_vnpu_class_selects_the_chips_of_its_template(device_class, selected):
    slices_ = [_slice("npu.huawei.com", 0, {"devices": [_npu(n, c) for n, c in ASCEND_CHIPS]})]
    expressions = _class_selectors(_overlay_classes("ascend")[device_class])
    assert _selected(expressions, slices_) == selected


# --- admin access, capacity, tolerations, opaque config -----------------------------------


def _example(kind: str, name: str) -> dict[str, Any]:
    (found,) = [
        d for d in _example_objects() if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    return found


async def test_admin_claim_selects_every_npu_in_a_namespace_allowed_admin_access():
    template = _example("ResourceClaimTemplate", "all-sim-npus-admin")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["adminAccess"] is True
    assert request["exactly"]["allocationMode"] == "All"
    namespace = _example("Namespace", template["metadata"]["namespace"])
    assert namespace["metadata"]["labels"]["resource.kubernetes.io/admin-access"] == "true"
    device_class = _overlay_classes("sim")[request["exactly"]["deviceClassName"]]
    assert _selected(_class_selectors(device_class), await _sim_slices()) == [
        f"npu-{i}" for i in range(8)
    ]


def test_admin_claim_is_used_by_a_daemonset_in_that_namespace():
    ds = _example("DaemonSet", "npu-monitor")
    pod = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == "dra-suite-monitoring"
    assert pod["resourceClaims"] == [
        {"name": "npus", "resourceClaimTemplateName": "all-sim-npus-admin"}
    ]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": "npus"}]


_BINARY = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _bytes(quantity: str) -> int:
    number, suffix = re.fullmatch(r"(\d+)([KMGT]i)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * _BINARY[suffix or ""]


async def test_capacity_request_filters_gpus_with_enough_memory_like_its_cel_equivalent():
    (request,) = _claim("sim-gpu-10gi-share")["spec"]["devices"]["requests"]
    wanted = request["exactly"]["capacity"]["requests"]
    assert wanted == {"memory": "10Gi"}
    device_class = _overlay_classes("sim")[request["exactly"]["deviceClassName"]]
    slices_ = await _sim_slices()
    candidates = _selected(_class_selectors(device_class), slices_)
    enough = [  # device.capacity[domain].memory.compareTo(quantity("10Gi")) >= 0
        d.name
        for d in scheduler.devices_of(slices_)
        if d.name in candidates
        and all(
            f"{SIM}/{name}" in d.capacity
            and _bytes(d.capacity[f"{SIM}/{name}"]["value"]) >= _bytes(q)
            for name, q in wanted.items()
        )
    ]
    assert enough == [f"gpu-{i}" for i in range(4)]


def test_tolerations_tolerate_the_taint_the_health_agent_writes_for_an_injected_fault():
    (request,) = _claim("one-sim-npu-tolerating-injected-faults")["spec"]["devices"]["requests"]
    tolerations = request["exactly"]["tolerations"]
    key = taint_key(SIM, "injected")
    assert key == "sim.dra-suite.io/injected"
    by_effect = {
        t["effect"]: t for t in tolerations if t["key"] == key and t["operator"] == "Exists"
    }
    assert set(by_effect) == {"NoSchedule", "NoExecute"}
    assert by_effect["NoExecute"]["tolerationSeconds"] == 300


def test_opaque_config_example_decodes_as_time_slicing_with_the_short_interval():
    (config,) = _claim("one-sim-gpu-timesliced")["spec"]["devices"]["config"]
    assert config["requests"] == ["gpu"]
    decoded = opaque.decode(config["opaque"]["parameters"], driver=config["opaque"]["driver"])
    assert decoded == opaque.DeviceConfig(
        strategy=opaque.Strategy.TIME_SLICING, interval=opaque.Interval.SHORT
    )


@pytest.mark.parametrize("overlay", ["sim", "nvidia"])
def test_sharing_class_config_decodes_for_its_overlays_driver(overlay):
    configs = [c for d in _overlay_classes(overlay).values() for c in d["spec"].get("config", [])]
    assert configs, "a sharing-mode class"
    for config in configs:
        decoded = opaque.decode(config["opaque"]["parameters"], driver=config["opaque"]["driver"])
        assert decoded.strategy is opaque.Strategy.TIME_SLICING
