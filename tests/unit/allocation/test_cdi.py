"""CDI specs: names per docs/contracts.md §7, minimum cdiVersion, validation rules, files on
disk."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIDevice, CDIWriter

DRIVER = "sim.dra-suite.io"
UID = "3f1b2c4d-0000-4000-8000-00000000abcd"


def test_names_follow_the_transient_spec_convention():
    assert spec_files.kind(DRIVER) == "k8s.sim.dra-suite.io/claim"
    assert spec_files.spec_file_name(DRIVER, UID) == f"k8s.sim.dra-suite.io-claim_{UID}.json"
    assert spec_files.device_name(UID, "npu-0") == f"{UID}-npu-0"
    assert spec_files.device_name(UID, "gpu-1", "s1") == f"{UID}-gpu-1-s1"
    assert spec_files.device_id(DRIVER, f"{UID}-npu-0") == f"k8s.sim.dra-suite.io/claim={UID}-npu-0"


@pytest.mark.parametrize(
    ("name", "nodes", "version"),
    [
        ("dev-a", [("/dev/x", "")], "0.3.0"),
        ("dev-a", [("/dev/x", "/dev/x")], "0.3.0"),
        ("dev-a", [("/dev/x", "/dev/null")], "0.5.0"),
        (f"{UID}-npu-0", [], "0.5.0"),
    ],
    ids=["plain", "same-host-path", "host-path", "name-starts-with-digit"],
)
def test_cdi_version_is_the_minimum_the_fields_need(name, nodes, version):
    spec = spec_files.build_spec(
        driver=DRIVER, devices=[CDIDevice(name=name, env={"A": "1"}, device_nodes=nodes)]
    )
    assert spec["cdiVersion"] == version
    assert spec_files.validate(spec) == []


def test_built_spec_has_device_nodes_and_sorted_env():
    spec = spec_files.build_spec(
        driver=DRIVER,
        devices=[
            CDIDevice(
                name=f"{UID}-npu-0",
                env={"B": "2", "A": "1"},
                device_nodes=[("/dev/davinci0", "/dev/null")],
            )
        ],
    )
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.sim.dra-suite.io/claim",
        "devices": [
            {
                "name": f"{UID}-npu-0",
                "containerEdits": {
                    "env": ["A=1", "B=2"],
                    "deviceNodes": [{"path": "/dev/davinci0", "hostPath": "/dev/null"}],
                },
            }
        ],
    }


def _spec(**changes: Any) -> dict[str, Any]:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.sim.dra-suite.io/claim",
        "devices": [{"name": "npu-0", "containerEdits": {"env": ["A=1"]}}],
    }
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (_spec(cdiVersion=""), "cdiVersion is required"),
        (_spec(devices=[]), "devices is required"),
        (_spec(kind="sim.dra-suite.io"), "is not vendor/class"),
        (_spec(kind="9vendor/claim"), "is not vendor/class"),
        (_spec(kind="vendor/claim-"), "is not vendor/class"),
        (_spec(devices=[{"name": "-bad", "containerEdits": {"env": ["A=1"]}}]), "is invalid"),
        (_spec(devices=[{"name": "npu-0", "containerEdits": {}}]), "empty container edits"),
        (
            _spec(devices=[{"name": "n", "containerEdits": {"env": ["A=1"]}}] * 2),
            "is duplicated",
        ),
        (
            _spec(
                cdiVersion="0.3.0",
                devices=[
                    {"name": "0npu", "containerEdits": {"env": ["A=1"]}},
                ],
            ),
            "is below 0.5.0",
        ),
    ],
    ids=[
        "no-version",
        "no-devices",
        "kind-without-class",
        "vendor-starts-with-digit",
        "class-ends-with-dash",
        "bad-device-name",
        "empty-edits",
        "duplicate-device",
        "version-too-low",
    ],
)
def test_validate_reports_what_a_cdi_loader_rejects(spec, problem):
    assert any(problem in p for p in spec_files.validate(spec)), spec_files.validate(spec)


async def test_writer_writes_lists_and_removes_specs(tmp_path):
    writer = CDIWriter(tmp_path, driver=DRIVER)
    writer.prepare_root()
    spec = _spec()
    await writer.write(UID, spec)
    path = tmp_path / spec_files.spec_file_name(DRIVER, UID)
    assert json.loads(path.read_text()) == spec
    assert path.stat().st_mode & 0o777 == 0o644
    assert writer.claim_uids() == [UID]
    assert await writer.remove(UID) is True
    assert await writer.remove(UID) is False
    assert writer.claim_uids() == []
    assert not writer.writes  # nothing kept per claim once it is gone


async def test_a_writer_without_fsync_writes_the_same_spec_and_matches_only_it(tmp_path):
    durable, fast = tmp_path / "durable", tmp_path / "fast"
    spec = _spec()
    for root, is_durable in ((durable, True), (fast, False)):
        writer = CDIWriter(root, driver=DRIVER, durable=is_durable)
        writer.prepare_root()
        assert not writer.matches(UID, spec)  # no file yet
        await writer.write(UID, spec)
        assert writer.matches(UID, spec)
        assert not writer.matches(UID, {**spec, "devices": []})
        assert writer.path(UID).stat().st_mode & 0o777 == 0o644
    name = spec_files.spec_file_name(DRIVER, UID)
    assert (durable / name).read_bytes() == (fast / name).read_bytes()


async def test_writer_ignores_specs_of_other_drivers(tmp_path):
    (tmp_path / spec_files.spec_file_name("other.example.com", UID)).write_text("{}")
    assert CDIWriter(tmp_path, driver=DRIVER).claim_uids() == []


def test_half_written_specs_of_this_driver_are_removed_and_others_kept(tmp_path):
    writer = CDIWriter(tmp_path, driver="sim.dra-suite.io")
    ours = tmp_path / ".k8s.sim.dra-suite.io-claim_abc.json.tmp-77"
    theirs = tmp_path / ".k8s.gpu.example.com-claim_abc.json.tmp-77"
    for path in (ours, theirs):
        path.write_bytes(b"{")
    assert writer.remove_temporaries() == [ours]
    assert [p.name for p in tmp_path.iterdir()] == [theirs.name]
