"""Device metadata (KEP-5304): the document against the schema derived from the Go types, the
container path of its mount for direct and template claims, and the files' lifecycle through
prepare, unprepare, a crash and a restart."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from jsonschema import Draft7Validator

from services.allocation.cdi import allowlist, spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import (
    POD_CLAIM_NAME_ANNOTATION,
    AllocatedClaim,
    ClaimReader,
    ClaimRef,
    DeviceResult,
    select,
)
from services.allocation.dra import planning
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.metadata import document
from services.allocation.metadata.files import MetadataFiles
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
ROOT = PurePosixPath("/var/lib/kubelet/plugins/sim.dra-suite.io/dra-device-metadata")
SCHEMA = json.loads(
    (Path(document.__file__).with_name("schema") / "devicemetadata.json").read_text()
)


def _gpu(name: str, index: int) -> inventory_pb2.Device:
    device = inventory_pb2.Device(
        name=name,
        kind="gpu",
        uuid=f"GPU-9d11c4e2-e840-51ed-b15f-0be7ae07368{index}",
        device_nodes=[inventory_pb2.DeviceNode(path=f"/dev/nvidia{index}", host_path="/dev/null")],
        env={"NVIDIA_VISIBLE_DEVICES": str(index)},
    )
    device.attributes["index"].int = index
    device.attributes["productName"].string = "NVIDIA H100 80GB HBM3"
    device.attributes["driverVersion"].version = "580.95.5"
    device.attributes["resource.kubernetes.io/pciBusID"].string = f"0000:4{index}:00.0"
    device.attributes["migCapable"].bool = True
    return device


def _inventory(count: int = 2) -> inventory_pb2.Inventory:
    devices = [_gpu(f"gpu-{i}", i) for i in range(count)]
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="sim", devices=devices, generation=1
    )


def _claim(uid: str, *devices: tuple[str, str], template: str | None = None) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef(namespace="team", name="trainer-gpus-x7k2p", uid=uid),
        results=tuple(DeviceResult(request=r, pool=NODE, device=d) for r, d in devices),
        pod_claim_name=template,
    )


def _objects(stream: bytes) -> list[dict[str, Any]]:
    """The objects of a JSON stream, as a Go json.Decoder reads them one by one."""
    decoder, text, objects, at = json.JSONDecoder(), stream.decode(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        found, at = decoder.raw_decode(text, at)
        objects.append(found)
    return objects


def _mounts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]


def test_the_file_holds_the_document_once_per_version_newest_first_and_each_validates():
    uid = str(uuid.uuid4())
    record = planning.plan(
        _claim(uid, ("gpus", "gpu-0"), ("gpus", "gpu-1")),
        _inventory(),
        driver=DRIVER,
        backend="sim",
        metadata_root=ROOT,
    )
    objects = _objects(document.encode_stream(record.device_metadata["gpus"]))
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    validator = Draft7Validator(SCHEMA)
    for found in objects:
        assert list(validator.iter_errors(found)) == []
        assert found["kind"] == "DeviceMetadata"
        assert found["metadata"] == {
            "name": "trainer-gpus-x7k2p",
            "namespace": "team",
            "uid": uid,
            "generation": 1,
        }
        assert "podClaimName" not in found
        (request,) = found["requests"]
        assert request["name"] == "gpus"
        assert [d["name"] for d in request["devices"]] == ["gpu-0", "gpu-1"]
        first = request["devices"][0]
        assert (first["driver"], first["pool"]) == (DRIVER, NODE)
        assert first["attributes"] == {
            "driverVersion": {"version": "580.95.5"},
            "index": {"int": 0},
            "migCapable": {"bool": True},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:40:00.0"},
            "uuid": {"string": "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073680"},
        }


@pytest.mark.parametrize(
    "broken",
    [
        {"requests": [{"name": "gpus", "devices": [{"pool": NODE, "name": "gpu-0"}]}]},
        {"requests": [{"name": "gpus", "devices": [{"driver": DRIVER, "pool": NODE,
                                                    "name": "GPU_0"}]}]},
        {"podClaimName": "Not/A/Label"},
        {"requests": [{"name": "gpus", "devices": [{
            "driver": DRIVER, "pool": NODE, "name": "gpu-0",
            "attributes": {f"a{i}": {"int": i} for i in range(33)}}]}]},
        {"requests": [{"name": "gpus", "devices": [{
            "driver": DRIVER, "pool": NODE, "name": "gpu-0",
            "attributes": {"a": {"int": 1, "string": "x"}}}]}]},
        {"unknownField": 1},
    ],
    ids=["no driver", "name not a DNS label", "pod claim name", "33 attributes",
         "two values in one attribute", "unknown field"],
)  # fmt: skip
def test_the_schema_refuses_what_the_go_validation_refuses(broken):
    found = {"kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v1beta1", **broken}
    assert list(Draft7Validator(SCHEMA).iter_errors(found))


def test_attributes_stop_at_32_as_the_go_types_allow():
    device = _gpu("gpu-0", 0)
    for i in range(40):
        device.attributes[f"extra{i:02d}"].int = i
    assert len(document.attributes(device)) == document.MAX_ATTRIBUTES


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"
               "trainer-gpus-x7k2p/gpus/sim.dra-suite.io-metadata.json"),
        ("gpus", "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/"
                 "gpus/gpus/sim.dra-suite.io-metadata.json"),
    ],
    ids=["a claim by name", "a claim from a template"],
)  # fmt: skip
def test_the_cdi_spec_mounts_the_file_read_only_at_the_contract_path(template, expected):
    uid = str(uuid.uuid4())
    record = planning.plan(
        _claim(uid, ("gpus", "gpu-0"), ("gpus", "gpu-1"), ("solo", "gpu-1"), template=template),
        _inventory(),
        driver=DRIVER,
        backend="sim",
        metadata_root=ROOT,
    )
    assert record.cdi_spec is not None
    spec = dict(record.cdi_spec)
    assert spec_files.validate(spec) == []
    mounts = _mounts(spec)
    # One mount per request, on the request's first device.
    assert [m["containerPath"] for m in mounts] == [
        expected,
        expected.replace("/gpus/s", "/solo/s"),
    ]
    assert mounts[0] == {
        "hostPath": f"{ROOT}/{uid}_gpus.json",
        "containerPath": expected,
        "options": ["ro", "bind"],
    }
    assert "mounts" in spec["devices"][0]["containerEdits"]
    assert "mounts" not in spec["devices"][1]["containerEdits"]
    if template:
        assert record.device_metadata["gpus"]["podClaimName"] == template


def test_a_template_claims_pod_claim_name_comes_from_its_annotation(make_claim):
    uid = str(uuid.uuid4())
    claim = make_claim(uid=uid, devices=["gpu-0"])
    claim["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpus"}
    ref = ClaimRef(namespace="default", name="claim-a", uid=uid)
    assert select(claim, ref=ref, driver=DRIVER, pool=NODE, node=NODE).pod_claim_name == "gpus"


def test_without_a_metadata_root_nothing_is_mounted_and_nothing_recorded():
    record = planning.plan(
        _claim(str(uuid.uuid4()), ("gpus", "gpu-0")), _inventory(), driver=DRIVER, backend="sim"
    )
    assert record.cdi_spec is not None
    assert _mounts(dict(record.cdi_spec)) == []
    assert record.device_metadata == {}


def test_a_pod_claim_name_that_is_no_dns_label_fails_the_claim():
    with pytest.raises(ClaimError, match="not a DNS label"):
        planning.plan(
            _claim(str(uuid.uuid4()), ("gpus", "gpu-0"), template="../../etc"),
            _inventory(),
            driver=DRIVER,
            backend="sim",
            metadata_root=ROOT,
        )


def test_the_allowlist_takes_the_mount_only_under_the_metadata_root():
    mount = document.mount(ROOT / "uid" / "gpus" / "metadata.json", PurePosixPath("/x"))
    assert allowlist.mount_allowed(mount, [ROOT])
    assert not allowlist.mount_allowed(mount, [])
    assert not allowlist.mount_allowed({**mount, "hostPath": "/etc/shadow"}, [ROOT])
    assert not allowlist.mount_allowed({**mount, "options": ["rw", "bind"]}, [ROOT])


# The files through prepare, unprepare, crash and restart


class _Inventory:
    def __init__(self) -> None:
        self.current = _inventory()


def _preparer(
    base: Path, kube: Any, *, enabled: bool = True, durable: bool = True
) -> ClaimPreparer:
    checkpoints = CheckpointStore(base / "checkpoint")
    checkpoints.load()
    (base / "cdi").mkdir(exist_ok=True)
    return ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=_Inventory(),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(base / "cdi", driver=DRIVER, durable=durable),
        driver=DRIVER,
        backend="sim",
        metadata_files=MetadataFiles(base / "dra-device-metadata", durable=durable),
        device_metadata=enabled,
    )


@pytest.fixture
def claim(kube_reader, make_claim) -> ClaimRef:
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["gpu-0", "gpu-1"], request="gpus"))
    return ClaimRef(namespace="default", name="claim-a", uid=uid)


def _file(base: Path, uid: str) -> Path:
    return base / "dra-device-metadata" / f"{uid}_gpus.json"


async def test_prepare_writes_the_file_the_spec_mounts_and_unprepare_removes_it(
    tmp_path, kube_reader, claim
):
    prep = _preparer(tmp_path, kube_reader)
    record = await prep.prepare(claim)
    path = _file(tmp_path, claim.uid)
    assert path.read_bytes() == document.encode_stream(record.device_metadata["gpus"])
    assert path.stat().st_mode & 0o777 == 0o644
    spec = json.loads((tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)).read_text())
    assert [m["hostPath"] for m in _mounts(spec)] == [str(path)]
    await prep.unprepare(claim)
    assert not path.exists()
    assert list((tmp_path / "dra-device-metadata").iterdir()) == []


async def test_with_the_feature_off_no_file_is_written(tmp_path, kube_reader, claim):
    prep = _preparer(tmp_path, kube_reader, enabled=False)
    await prep.prepare(claim)
    assert not (tmp_path / "dra-device-metadata").exists()


async def test_a_restart_rewrites_a_lost_file_and_removes_orphans(tmp_path, kube_reader, claim):
    prep = _preparer(tmp_path, kube_reader)
    record = await prep.prepare(claim)
    path = _file(tmp_path, claim.uid)
    path.unlink()
    # An orphan: a crash after the metadata write, before any record (and its temporary).
    orphan = _file(tmp_path, str(uuid.uuid4()))
    orphan.write_text("{}")
    temporary = path.parent / f".{path.name}.tmp-4242"
    temporary.write_text("{")
    restarted = _preparer(tmp_path, kube_reader)
    await restarted.recover()
    assert path.read_bytes() == document.encode_stream(record.device_metadata["gpus"])
    assert not orphan.exists()
    assert not temporary.exists()
    # A repeated prepare answers from the checkpoint and finds everything in place.
    assert await restarted.prepare(claim) == record


async def test_a_repeated_prepare_rewrites_a_lost_file(tmp_path, kube_reader, claim):
    prep = _preparer(tmp_path, kube_reader)
    await prep.prepare(claim)
    path = _file(tmp_path, claim.uid)
    path.unlink()
    await prep.prepare(claim)
    assert path.is_file()


async def test_a_claim_prepared_with_metadata_keeps_it_when_the_feature_is_turned_off(
    tmp_path, kube_reader, claim
):
    await _preparer(tmp_path, kube_reader).prepare(claim)
    _file(tmp_path, claim.uid).unlink()
    off = _preparer(tmp_path, kube_reader, enabled=False)
    await off.recover()
    assert _file(tmp_path, claim.uid).is_file()  # its spec still mounts it
    await off.unprepare(claim)
    assert not _file(tmp_path, claim.uid).exists()


async def test_a_restart_rewrites_a_file_a_power_loss_left_empty(tmp_path, kube_reader, claim):
    prep = _preparer(tmp_path, kube_reader)
    record = await prep.prepare(claim)
    path = _file(tmp_path, claim.uid)
    path.write_bytes(b"")  # written without fsync, then the power went
    await _preparer(tmp_path, kube_reader).recover()
    assert path.read_bytes() == document.encode_stream(record.device_metadata["gpus"])


async def test_a_restart_rewrites_a_spec_a_power_loss_left_empty_or_old(
    tmp_path, kube_reader, claim
):
    # The agent writes specs and metadata files without fsync, as here.
    prep = _preparer(tmp_path, kube_reader, durable=False)
    record = await prep.prepare(claim)
    spec = tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)
    written = spec.read_bytes()
    assert json.loads(written) == record.cdi_spec
    for lost in (b"", written.replace(b"gpu-1", b"gpu-9")):
        spec.write_bytes(lost)  # renamed into place, its data never reached the disk
        await _preparer(tmp_path, kube_reader, durable=False).recover()
        assert spec.read_bytes() == written


async def test_a_claim_prepared_before_the_flat_layout_keeps_its_files_where_its_spec_mounts_them(
    tmp_path, kube_reader, claim
):
    # A record and files as an agent before the flat layout left them.
    record = await _preparer(tmp_path, kube_reader).prepare(claim)
    flat = _file(tmp_path, claim.uid)
    legacy = tmp_path / "dra-device-metadata" / claim.uid / "gpus" / "metadata.json"
    legacy.parent.mkdir(parents=True)
    flat.rename(legacy)
    old_spec = json.loads(json.dumps(record.cdi_spec).replace(str(flat), str(legacy)))
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    await checkpoints.put(replace(record, cdi_spec=old_spec))
    spec_file = tmp_path / "cdi" / spec_files.spec_file_name(DRIVER, claim.uid)
    spec_file.write_text(json.dumps(old_spec, indent=2, sort_keys=True))
    written = legacy.read_bytes()

    upgraded = _preparer(tmp_path, kube_reader)
    await upgraded.recover()
    assert legacy.read_bytes() == written
    assert not flat.exists()
    legacy.write_bytes(b"")  # a power loss: rewritten where the spec mounts it
    await _preparer(tmp_path, kube_reader).recover()
    assert legacy.read_bytes() == written
    assert not flat.exists()
    assert json.loads(spec_file.read_text()) == old_spec

    await upgraded.unprepare(claim)
    assert list((tmp_path / "dra-device-metadata").iterdir()) == []
