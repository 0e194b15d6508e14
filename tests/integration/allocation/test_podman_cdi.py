"""Podman as the container runtime of a prepared claim (issues 24 and 27).

The allocation agent (in-process, sim backend, API emulator on 1.36, so `--device-metadata
auto` writes the metadata file) prepares a claim through the kubelet emulator over its real
unix socket; podman starts a container with the CDI device IDs the prepare answered, reading
the agent's spec file itself (linked into /var/run/cdi, tests/runtime_podman.py). Inside the
container: every variable the spec sets for those devices, every device node as the host
node it maps (sim: /dev/null), every mount readable with the host file's bytes, and the device
metadata file at the KEP-5304 contract path naming the claim, request, driver and devices.
After the unprepare podman no longer resolves the devices.
"""

from __future__ import annotations

import os

import pytest

from services.allocation.cdi import spec_files
from tests import runtime_podman
from tests.runtime_podman import Podman

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
CONTRACT_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return runtime_podman.podman_runtime(tmp_path_factory)


@pytest.mark.parametrize(
    ("pod_claim_name", "contract_path"),
    [
        (None, f"{CONTRACT_DIR}/resourceclaims/train/npu/{DRIVER}-metadata.json"),
        ("accel", f"{CONTRACT_DIR}/resourceclaimtemplates/accel/npu/{DRIVER}-metadata.json"),
    ],
    ids=["claim", "template-claim"],
)
async def test_a_podman_container_gets_what_the_claims_cdi_spec_says(
    plugin_node, podman: Podman, pod_claim_name: str | None, contract_path: str
):
    node = plugin_node
    await node.publish_inventory("npu-0", "npu-1")
    claim = node.allocate("train", ["npu-0", "npu-1"])
    if pod_claim_name is not None:  # as the resourceclaim controller makes it from a template
        made = node.api.get_object("resourceclaims", "train", namespace="default")
        assert made is not None
        made["metadata"]["annotations"] = {POD_CLAIM_ANNOTATION: pod_claim_name}
        node.api.update_object(made)
    spec_path = node.config.cdi_root / spec_files.spec_file_name(DRIVER, claim.uid)
    with runtime_podman.published(spec_path):
        async with node.registered() as (_, kubelet):
            answer = (await kubelet.prepare([claim])).claims[claim.uid]
            assert not answer.error, answer.error
            ids = [cdi for device in answer.devices for cdi in device.cdi_device_ids]
            assert len(ids) == 2
            spec = node.spec(claim.uid)
            assert spec is not None
            version = tuple(int(part) for part in spec["cdiVersion"].split("."))
            assert version <= (0, 5, 0)  # the newest podman 4.3.1 resolves
            edits = runtime_podman.spec_edits(spec, ids)
            assert edits.env
            assert edits.nodes
            mounted = [str(m["containerPath"]) for m in edits.mounts]
            assert contract_path in mounted

            seen = await podman.look(ids, nodes=list(edits.nodes), files=mounted)

            assert {key: seen.env.get(key) for key in edits.env} == edits.env
            assert seen.nodes == {path: _rdev(host) for path, host in edits.nodes.items()}
            assert seen.files == edits.mounted_files()
            text = seen.files[contract_path]
            assert text is not None
            newest, *older = runtime_podman.json_objects(text)
            assert [newest["apiVersion"], *(o["apiVersion"] for o in older)] == [
                "metadata.resource.k8s.io/v1beta1",
                "metadata.resource.k8s.io/v1alpha1",
            ]
            meta = newest["metadata"]
            assert (meta["name"], meta["namespace"], meta["uid"]) == ("train", "default", claim.uid)
            assert newest.get("podClaimName") == pod_claim_name
            (request,) = newest["requests"]
            assert request["name"] == "npu"
            assert [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
                (DRIVER, "node-a", "npu-0"),
                (DRIVER, "node-a", "npu-1"),
            ]

            answer = (await kubelet.unprepare([claim])).claims[claim.uid]
            assert not answer.error, answer.error
            await podman.assert_unresolvable(ids)


def _rdev(host: str) -> tuple[int, int]:
    st = os.stat(host)
    return os.major(st.st_rdev), os.minor(st.st_rdev)
