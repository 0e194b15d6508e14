"""The NVIDIA vendor package: MIG geometry and device naming, shared by every agent."""

from __future__ import annotations

import pytest

from shared.nvml import NVMLCallError
from shared.vendors.nvidia import mig, naming
from tests.fakes.nvml import MODELS, FakeNVML


def test_the_h100_table_is_what_nvml_reports_for_an_h100_80gb():
    # The fake H100 answers as a real one does (an H100 80GB HBM3 with driver 580 reported
    # exactly these profiles, engines, memory and placements).
    fake = FakeNVML.node("H100-80GB", count=1)
    fake.initialised = True
    gpu = fake.gpus[0]
    reported = {}
    for enum in range(0x12):
        try:
            info = fake.gpu_instance_profile(gpu, enum)
        except NVMLCallError:
            continue
        reported[info.id] = mig.MigProfile(info, fake.gpu_instance_placements(gpu, info.id))
    assert {p.info.id: p for p in mig.H100_80GB} == reported
    assert [p.name for p in mig.H100_80GB] == list(MODELS["H100-80GB"].names)


def test_profiles_know_their_slices_and_starts():
    three_g = mig.find(mig.H100_80GB, name="3g.40gb")
    assert three_g is not None
    assert (three_g.info.slice_count, three_g.memory_slices, three_g.starts) == (3, 4, (0, 4))
    assert three_g.placement(4) == mig.Placement(4, 4)
    assert three_g.placement(2) is None
    assert mig.find(mig.H100_80GB, profile_id=0) is mig.find(mig.H100_80GB, name="7g.80gb")
    assert mig.find(mig.H100_80GB, name="1g.5gb") is None
    assert mig.Placement(0, 4).overlaps(mig.Placement(3, 1))
    assert not mig.Placement(0, 4).overlaps(mig.Placement(4, 4))


@pytest.mark.parametrize(
    ("name", "shaped"),
    [("1g.10gb", True), ("1g.10gb+me", True), ("1c.3g.40gb", True), ("vir05_1c_8g", False)],
)
def test_profile_names_are_recognised_by_shape(name, shaped):
    assert mig.is_profile_name(name) is shaped
    assert mig.profile_name(f"MIG {name}") == name


def test_gpu_and_mig_names_read_back():
    assert naming.gpu_name(3) == "gpu-3"
    assert [naming.gpu_index(n) for n in ("gpu-3", "gpu-03", "gpu-0-mig-1g10gb-19-0")] == [
        3,
        None,
        None,
    ]
    name = naming.mig_name("gpu-1", "1g.10gb+me", 20, 3)
    assert name == "gpu-1-mig-1g10gb-me-20-3"
    assert naming.mig_slot(name, "gpu-1") == (20, 3)
    assert naming.mig_slot(name, "gpu-10") is None
    assert naming.mig_slot("gpu-1", "gpu-1") is None
    assert naming.counter_set_name("gpu-1") == "gpu-1-counter-set"


def test_mig_uuids_and_capability_nodes_follow_the_driver():
    assert naming.mig_uuid("5c1a2b3c-0000") == "MIG-5c1a2b3c-0000"
    assert naming.mig_uuid("MIG-5c1a2b3c-0000") == "MIG-5c1a2b3c-0000"
    # /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, gpu0/gi0/access 3,
    # gpu0/gi0/ci0/access 4, gpu0/gi1/access 12, gpu1/gi0/access 138.
    assert naming.gpu_instance_cap(0, 0) == 3
    assert naming.compute_instance_cap(0, 0, 0) == 4
    assert naming.gpu_instance_cap(0, 1) == 12
    assert naming.gpu_instance_cap(1, 0) == 138
    assert naming.caps_node(138) == "/dev/nvidia-caps/nvidia-cap138"
