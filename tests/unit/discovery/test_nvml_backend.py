"""The NVML backend through the fake NVML: attributes, versions, topology, MIG, failures."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest

from services.discovery import inventory, slices, validation
from shared.errors import BackendLoadError, BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.nvidia import nvml_api
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.nvml import FakeNVML

DRIVER = "gpu.dra-suite.io"
IDENTITY = inventory.Identity(driver=DRIVER, node="n1", pool="n1", backend="nvml")
H100_PROFILES = ("1g.10gb", "3g.40gb", "7g.80gb")


def backend(fake: FakeNVML, sysfs_root: Path | None = None, **options) -> nvml.NvmlBackend:
    sysfs = Sysfs(sysfs_root) if sysfs_root is not None else Sysfs("/nonexistent")
    return nvml.NvmlBackend.open(fake, options=nvml.NvmlOptions(**options), sysfs=sysfs)


def by_name(scan) -> dict[str, inventory_pb2.Device]:
    return {device.name: device for device in scan.devices}


def value(attribute: inventory_pb2.AttributeValue):
    kind = attribute.WhichOneof("value")
    return getattr(attribute, kind) if kind else None


async def test_every_gpu_is_published_with_its_identity_and_versions(tmp_path):
    fake = FakeNVML.node("H100-80GB", count=8)
    fake.populate_sysfs(tmp_path)
    scan = await backend(fake, tmp_path).scan()
    devices = by_name(scan)
    assert sorted(devices) == [f"gpu-{i}" for i in range(8)]
    gpu = devices["gpu-3"]
    attributes = {key: value(v) for key, v in gpu.attributes.items()}
    assert attributes == {
        "type": "gpu",
        "uuid": fake.gpus[3].uuid,
        "index": 3,
        "productName": "NVIDIA H100 80GB HBM3",
        "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:50",
        "numaNode": 0,
        "migCapable": True,
        "interconnectGroup": "nvlink-0",
    }
    assert gpu.attributes["driverVersion"].WhichOneof("value") == "version"
    assert dict(gpu.capacity) == {"memory": "81559Mi"}
    assert (gpu.kind, gpu.uuid) == ("gpu", fake.gpus[3].uuid)
    assert gpu.device_nodes[0].path == "/dev/nvidia3"
    assert gpu.env["NVIDIA_VISIBLE_DEVICES"] == fake.gpus[3].uuid
    assert scan.shared_counters == ()
    assert all(not validation.check_device(d, driver=DRIVER) for d in scan.devices)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("550.54.15", "550.54.15"),
        ("580.95.05", "580.95.5"),
        ("535.104.05", "535.104.5"),
        ("470.82", "470.82.0"),
        ("560.28.03-beta", None),
    ],
    ids=["plain", "leading-zero", "three-digit-minor", "two-parts", "not-numeric"],
)
def test_driver_versions_become_semver(raw, expected):
    assert nvml.semver(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"), [(12040, "12.4.0"), (13000, "13.0.0"), (11080, "11.8.0")]
)
def test_cuda_driver_versions_become_semver(raw, expected):
    assert nvml.cuda_version(raw) == expected


async def test_a_driver_version_that_is_not_semver_is_left_out():
    fake = FakeNVML.node(count=1)
    fake.driver = "560.28.03-beta"
    gpu = by_name(await backend(fake).scan())["gpu-0"]
    assert "driverVersion" not in gpu.attributes


async def test_pci_bus_id_is_published_only_when_asked():
    fake = FakeNVML.node(count=1)
    plain = by_name(await backend(fake).scan())["gpu-0"]
    assert "resource.kubernetes.io/pciBusID" not in plain.attributes
    asked = by_name(await backend(fake, pci_bus_id=True).scan())["gpu-0"]
    assert asked.attributes["resource.kubernetes.io/pciBusID"].string == "0000:18:00.0"


async def test_without_sysfs_entries_pcie_root_and_numa_node_are_left_out():
    gpu = by_name(await backend(FakeNVML.node(count=1)).scan())["gpu-0"]
    assert "resource.kubernetes.io/pcieRoot" not in gpu.attributes
    assert "numaNode" not in gpu.attributes


@pytest.mark.parametrize(
    ("nvlink", "groups"),
    [
        ("nvswitch", ["nvlink-0"] * 4),
        ("pairs", ["nvlink-0", "nvlink-0", "nvlink-1", "nvlink-1"]),
        ("none", [None] * 4),
    ],
    ids=["hgx-nvswitch", "bridged-pairs", "pcie-only"],
)
async def test_interconnect_groups_follow_nvlink(nvlink, groups):
    devices = by_name(await backend(FakeNVML.node(count=4, nvlink=nvlink)).scan())
    found = [
        devices[f"gpu-{i}"].attributes["interconnectGroup"].string
        if "interconnectGroup" in devices[f"gpu-{i}"].attributes
        else None
        for i in range(4)
    ]
    assert found == groups


async def test_a_gpu_without_mig_is_not_mig_capable_and_gets_no_partitions():
    scan = await backend(
        FakeNVML.node("L4", count=2, nvlink="none"), mig_profiles=("1g.10gb",)
    ).scan()
    assert sorted(by_name(scan)) == ["gpu-0", "gpu-1"]
    assert by_name(scan)["gpu-0"].attributes["migCapable"].bool is False
    assert by_name(scan)["gpu-0"].attributes["architecture"].string == "Ada"
    assert scan.shared_counters == ()


async def test_hopper_publishes_mig_placements_of_the_configured_profiles():
    scan = await backend(FakeNVML.node("H100-80GB", count=1), mig_profiles=H100_PROFILES).scan()
    names = sorted(by_name(scan))
    assert names == sorted(
        ["gpu-0"]
        + [f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)]
        + ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-7g80gb-0-0"]
    )
    (counters,) = scan.shared_counters
    assert counters.name == "gpu-0-counter-set"
    assert dict(counters.counters) == {
        "compute-slices": "7",
        "multiprocessors": "132",
        "copy-engines": "8",
        "decoders": "7",
        "jpeg-engines": "7",
        "ofa-engines": "1",
        "memory": "81152Mi",
        **{f"memory-slice-{i}": "1" for i in range(8)},
    }


async def test_a_partition_consumes_its_share_and_its_memory_slices():
    scan = await backend(FakeNVML.node("H100-80GB", count=1), mig_profiles=H100_PROFILES).scan()
    part = by_name(scan)["gpu-0-mig-3g40gb-9-4"]
    (consumption,) = part.consumes_counters
    assert consumption.counter_set == "gpu-0-counter-set"
    assert dict(consumption.counters) == {
        "compute-slices": "3",
        "multiprocessors": "60",
        "copy-engines": "3",
        "decoders": "3",
        "jpeg-engines": "3",
        "memory": "40448Mi",
        **{f"memory-slice-{i}": "1" for i in (4, 5, 6, 7)},
    }
    assert (part.kind, part.parent, part.uuid) == ("mig", "gpu-0", "")
    attributes = {key: value(v) for key, v in part.attributes.items()}
    assert attributes["type"] == "mig"
    assert attributes["profile"] == "3g.40gb"
    assert attributes["parentUUID"] == by_name(scan)["gpu-0"].uuid
    assert attributes["placementStart"] == 4
    assert attributes["productName"] == "NVIDIA H100 80GB HBM3"
    assert "uuid" not in attributes
    assert dict(part.capacity)["memory"] == "40448Mi"
    whole = by_name(scan)["gpu-0"]
    assert dict(whole.consumes_counters[0].counters) == dict(scan.shared_counters[0].counters)


def _quantity(text: str) -> int:
    return int(text[:-2]) << 20 if text.endswith("Mi") else int(text)


def _fits(devices: list[inventory_pb2.Device], counter_set: inventory_pb2.CounterSet) -> bool:
    """Whether the scheduler could allocate all of `devices` at once (counters suffice)."""
    used: dict[str, int] = {}
    for device in devices:
        for consumption in device.consumes_counters:
            for name, amount in consumption.counters.items():
                used[name] = used.get(name, 0) + _quantity(amount)
    return all(used[n] <= _quantity(counter_set.counters[n]) for n in used)


@pytest.mark.parametrize(
    ("together", "fits"),
    [
        (["gpu-0"], True),
        (["gpu-0", "gpu-0-mig-1g10gb-19-6"], False),
        (["gpu-0", "gpu-0-mig-7g80gb-0-0"], False),
        ([f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)], True),
        (["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"], True),
        (["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-3g40gb-9-4"], True),
        (["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-3g40gb-9-0"], False),
        (["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-2"], False),
        (
            [
                "gpu-0-mig-2g20gb-14-0",
                "gpu-0-mig-2g20gb-14-2",
                "gpu-0-mig-2g20gb-14-4",
                "gpu-0-mig-1g10gb-19-6",
            ],
            True,
        ),
    ],
    ids=[
        "whole-gpu-alone",
        "whole-gpu-and-a-1g",
        "whole-gpu-and-the-7g",
        "seven-1g",
        "two-3g",
        "4g-and-3g",
        "4g-and-3g-overlapping",
        "3g-and-a-1g-inside-it",
        "three-2g-and-a-1g",
    ],
)
async def test_counters_let_only_real_mig_layouts_through(together, fits):
    profiles = ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    scan = await backend(FakeNVML.node("H100-80GB", count=1), mig_profiles=profiles).scan()
    devices = by_name(scan)
    assert _fits([devices[name] for name in together], scan.shared_counters[0]) is fits


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("H200-141GB", ["gpu-0-mig-1g18gb-19-0", "gpu-0-mig-1g18gb-me-20-3"]),
        ("A100-80GB", ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-me-20-3"]),
    ],
    ids=["h200", "a100-mig-on"],
)
async def test_profile_names_follow_the_model(model, names):
    profiles = ("1g.18gb", "1g.18gb+me", "1g.10gb", "1g.10gb+me")
    fake = FakeNVML.node(model, count=1, mig_enabled=True)
    devices = by_name(await backend(fake, mig_profiles=profiles).scan())
    assert set(names) <= set(devices)
    assert len(devices) == 1 + 7 + 7


async def test_ampere_offers_partitions_only_while_mig_is_on():
    fake = FakeNVML.node("A100-80GB", count=1, mig_enabled=False)
    scan = await backend(fake, mig_profiles=("1g.10gb",)).scan()
    assert sorted(by_name(scan)) == ["gpu-0"]
    assert scan.shared_counters == ()


async def test_a_full_node_of_partitions_fits_the_slice_limits():
    profiles = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
    scan = await backend(FakeNVML.node("H100-80GB", count=8), mig_profiles=profiles).scan()
    assert len(scan.devices) == 8 * (1 + 7 + 7 + 4 + 3 + 2 + 1 + 1)  # whole GPU + placements
    pool = slices.desired(inventory.build(scan, identity=IDENTITY, scanned_unix_ms=0))
    assert pool.rejected == ()
    counter_slices = [c for c in pool.contents if "sharedCounters" in c]
    device_slices = [c for c in pool.contents if "devices" in c]
    assert [len(c["sharedCounters"]) for c in counter_slices] == [8]
    assert all(len(c["sharedCounters"][0]["counters"]) <= 32 for c in counter_slices)
    assert [len(c["devices"]) for c in device_slices] == [64, 64, 64, 16]


async def test_nine_gpus_spill_counter_sets_into_a_second_slice():
    scan = await backend(FakeNVML.node("H100-80GB", count=9), mig_profiles=("7g.80gb",)).scan()
    pool = slices.desired(inventory.build(scan, identity=IDENTITY, scanned_unix_ms=0))
    assert [len(c["sharedCounters"]) for c in pool.contents if "sharedCounters" in c] == [8, 1]


async def test_unknown_profile_names_publish_no_partitions():
    scan = await backend(FakeNVML.node("H100-80GB", count=1), mig_profiles=("1g.18gb",)).scan()
    assert sorted(by_name(scan)) == ["gpu-0"]
    (counters,) = scan.shared_counters  # the GPU is still partitionable, just not split
    assert by_name(scan)["gpu-0"].consumes_counters[0].counter_set == counters.name


# --- MIG slots: options made on demand, MIG devices that exist --------------------------------


async def test_placements_are_options_made_on_demand_over_the_gpus_counters():
    scan = await backend(FakeNVML.node("H100-80GB", count=1), mig_profiles=H100_PROFILES).scan()
    (counters,) = scan.shared_counters
    options = [d for d in scan.devices if d.kind == "mig"]
    assert len(options) == 7 + 2 + 1
    for option in options:
        # What the allocation agent reads to make it at prepare: flag, parent, profile, start.
        assert option.attributes["createdOnDemand"].bool is True
        assert (option.parent, option.uuid, dict(option.env)) == ("gpu-0", "", {})
        assert option.attributes["profile"].string in H100_PROFILES
        assert option.attributes["placementStart"].WhichOneof("value") == "int"
        assert "uuid" not in option.attributes
        [consumption] = option.consumes_counters
        assert consumption.counter_set == counters.name
        assert set(consumption.counters) <= set(counters.counters)
    assert "createdOnDemand" not in by_name(scan)["gpu-0"].attributes


def _caps(device: inventory_pb2.Device) -> list[str]:
    return [n.path for n in device.device_nodes if n.path.startswith("/dev/nvidia-caps/")]


async def test_mig_devices_that_exist_are_published_with_their_uuids():
    fake = FakeNVML.node("H100-80GB", count=2, mig_enabled=True)
    three_g = fake.make_mig_device(1, 9, 4)  # 3g.40gb on memory slices 4-7 of GPU 1
    one_g = fake.make_mig_device(1, 19, 0)  # 1g.10gb on slice 0
    # No --mig-profiles: only what exists is published, never an option.
    scan = await backend(fake).scan()
    devices = by_name(scan)
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-3g40gb-9-4"]
    for name, made in (("gpu-1-mig-3g40gb-9-4", three_g), ("gpu-1-mig-1g10gb-19-0", one_g)):
        device = devices[name]
        assert made.uuid.startswith("MIG-")
        assert (device.kind, device.parent, device.uuid) == ("mig", "gpu-1", made.uuid)
        assert device.attributes["uuid"].string == made.uuid
        assert device.env["NVIDIA_VISIBLE_DEVICES"] == made.uuid
        assert "createdOnDemand" not in device.attributes
        assert device.attributes["parentUUID"].string == fake.gpus[1].uuid
        # The GI's and CI's capability nodes of GPU minor 1, as mig-minors numbers them.
        gi = 3 + 9 * (15 * 1 + made.gpu_instance)
        assert _caps(device) == [f"/dev/nvidia-caps/nvidia-cap{m}" for m in (gi, gi + 1)]
        assert device.device_nodes[0].path == "/dev/nvidia1"
    assert devices["gpu-1-mig-3g40gb-9-4"].attributes["placementStart"].int == 4
    # Both consume the GPU's counters: the whole GPU can no longer be handed out with them.
    (counters,) = scan.shared_counters
    assert counters.name == "gpu-1-counter-set"
    assert not _fits([devices["gpu-1"], devices["gpu-1-mig-1g10gb-19-0"]], counters), (
        "the whole GPU and its MIG device together"
    )
    assert _fits([devices["gpu-1-mig-1g10gb-19-0"], devices["gpu-1-mig-3g40gb-9-4"]], counters)
    assert not devices["gpu-0"].consumes_counters  # no MIG device, no options: as before
    sets = [counters.name]
    assert all(
        not validation.check_device(d, driver=DRIVER, counter_sets=sets) for d in scan.devices
    )


async def test_options_are_only_the_placements_still_free():
    profiles = ("1g.10gb", "1g.10gb+me", "3g.40gb", "7g.80gb")
    fake = FakeNVML.node("H100-80GB", count=1, mig_enabled=True)
    made = fake.make_mig_device(0, 9, 4)  # 3g.40gb on slices 4-7
    fake.make_mig_device(0, 20, 1)  # 1g.10gb+me on slice 1: its only instance
    devices = by_name(await backend(fake, mig_profiles=profiles).scan())
    on_demand = sorted(n for n, d in devices.items() if "createdOnDemand" in d.attributes)
    assert not [d for d in devices.values() if d.kind == "mig" and d.uuid]
    assert made.uuid not in str(devices)
    # Slots holding a MIG device of an offered profile stay the options they were allocated as.
    # Free: 1g.10gb on slices 0, 2 and 3. Nothing overlapping slices 1 or 4-7, no second
    # 1g.10gb+me (one per GPU), no 3g.40gb at 0 (overlaps slice 1), no 7g.80gb.
    assert on_demand == [
        *(f"gpu-0-mig-1g10gb-19-{s}" for s in (0, 2, 3)),
        "gpu-0-mig-1g10gb-me-20-1",
        "gpu-0-mig-3g40gb-9-4",
    ]


async def test_a_slot_is_published_alike_before_during_and_after_its_mig_device():
    # The allocation agent makes the MIG device of an option at prepare and destroys it at
    # unprepare; discovery sees either only at its next scan. The slot it publishes meanwhile
    # must name no UUID that unprepare destroys: it is the same device throughout.
    fake = FakeNVML.node("H100-80GB", count=1, mig_enabled=True)
    offered = ("1g.10gb", "3g.40gb")
    before = by_name(await backend(fake, mig_profiles=offered).scan())["gpu-0-mig-3g40gb-9-4"]
    made = fake.make_mig_device(0, 9, 4)
    during = by_name(await backend(fake, mig_profiles=offered).scan())["gpu-0-mig-3g40gb-9-4"]
    assert during == before
    assert made.uuid not in str(during)
    admins = by_name(await backend(fake).scan())["gpu-0-mig-3g40gb-9-4"]
    assert admins.uuid == made.uuid  # a profile the node does not offer: an admin's layout


async def test_a_gpu_instance_still_without_its_compute_instance_stays_its_slots_option():
    fake = FakeNVML.node("H100-80GB", count=1, mig_enabled=True)
    made = fake.make_mig_device(0, 9, 4)
    gi = fake.instances[0][made.gpu_instance]
    gi.cis, gi.uuids = {}, {}  # the agent was killed between the GPU and compute instance
    devices = by_name(await backend(fake, mig_profiles=("1g.10gb", "3g.40gb")).scan())
    # The claim that got the option still finds it (its retry completes the MIG device);
    # nothing else is offered on slices 4-7.
    slot = devices["gpu-0-mig-3g40gb-9-4"]
    assert (slot.attributes["createdOnDemand"].bool, slot.uuid) == (True, "")
    assert sorted(n for n in devices if n != "gpu-0") == [
        *(f"gpu-0-mig-1g10gb-19-{s}" for s in range(4)),
        "gpu-0-mig-3g40gb-9-0",
        "gpu-0-mig-3g40gb-9-4",
    ]


async def test_a_gpu_instance_with_several_compute_instances_is_left_out_but_blocks_options():
    fake = FakeNVML.node("H100-80GB", count=1, mig_enabled=True)
    made = fake.make_mig_device(0, 14, 2)  # 2g.20gb on slices 2-3 ...
    gi = fake.instances[0][made.gpu_instance]
    gi.cis = {0: 1, 1: 1}  # ... split into two 1-slice compute instances: two MIG devices
    gi.uuids = {0: made.uuid, 1: "MIG-00000000-0000-4000-8000-000000000001"}
    devices = by_name(await backend(fake, mig_profiles=("1g.10gb", "2g.20gb")).scan())
    assert not [d for d in devices.values() if d.uuid.startswith("MIG-")]
    assert sorted(n for n in devices if n != "gpu-0") == [
        "gpu-0-mig-1g10gb-19-0",
        "gpu-0-mig-1g10gb-19-1",
        "gpu-0-mig-1g10gb-19-4",
        "gpu-0-mig-1g10gb-19-5",
        "gpu-0-mig-1g10gb-19-6",
        "gpu-0-mig-2g20gb-14-0",
        "gpu-0-mig-2g20gb-14-4",
    ]


def test_a_missing_driver_fails_the_load_with_a_clear_message():
    fake = FakeNVML.node(count=1)
    fake.init_error = nvml_api.NVMLCallError("nvmlInit", code=9, message="Driver Not Loaded")
    with pytest.raises(
        BackendLoadError, match="NVML is not available: nvmlInit: Driver Not Loaded"
    ):
        nvml.NvmlBackend.open(fake)


@pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None, reason="pynvml is installed here"
)
def test_a_missing_nvml_package_fails_the_load_with_a_clear_message():
    with pytest.raises(BackendLoadError, match="NVML is not available: the nvidia-ml-py"):
        nvml_api.open_library()


async def test_a_failing_call_fails_the_scan():
    fake = FakeNVML.node(count=2)
    fake.fail["memory_total"] = nvml_api.NVMLCallError("memory_total", code=15, message="lost")
    with pytest.raises(BackendUnavailableError, match="NVML: memory_total: lost"):
        await backend(fake).scan()


async def test_a_wedged_driver_times_out_and_later_scans_fail_fast_until_it_returns():
    fake = FakeNVML.node(count=1)
    nvml_backend = backend(fake, timeout_s=0.2)
    fake.release = threading.Event()
    with pytest.raises(BackendUnavailableError, match=r"longer than 0\.2s"):
        await nvml_backend.scan()
    with pytest.raises(BackendUnavailableError, match="still blocked"):
        await nvml_backend.scan()
    fake.release.set()
    await asyncio.sleep(0.2)
    assert [d.name for d in (await nvml_backend.scan()).devices] == ["gpu-0"]


async def test_watch_asks_for_rescans_periodically():
    nvml_backend = backend(FakeNVML.node(count=1), poll_s=0.05)
    task = asyncio.create_task(nvml_backend.watch())
    try:
        await asyncio.wait_for(nvml_backend.changed.wait(), 1)
    finally:
        task.cancel()


def test_close_shuts_nvml_down():
    fake = FakeNVML.node(count=1)
    nvml_backend = backend(fake)
    assert fake.initialised
    nvml_backend.close()
    assert not fake.initialised
