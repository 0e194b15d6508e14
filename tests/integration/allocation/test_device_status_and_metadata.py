"""The allocation agent on the API emulator (Kubernetes 1.36): a prepared claim gets a device
metadata file mounted by its CDI spec (KEP-5304) and its devices' conditions in
`status.devices` (KEP-4817), kept current with the health KV; unprepare removes both. On 1.35
(`--device-metadata auto`) no metadata file is written."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

import pytest

from services.allocation.metadata import document
from shared.pb.drasuite.v1 import health_pb2

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"


def _ours(claim: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [
        d for d in ((claim or {}).get("status") or {}).get("devices") or [] if d["driver"] == DRIVER
    ]


def _conditions(entry: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in entry["conditions"]}


async def test_a_prepared_claim_gets_metadata_and_device_status_until_unprepared(plugin_node):
    node = plugin_node
    await node.publish_inventory("npu-0", "npu-1")
    await node.publish_health("npu-0", health_pb2.HEALTH_STATE_HEALTHY)
    claim = node.allocate("train", ["npu-0", "npu-1"])
    async with node.registered() as (_, kubelet):
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert not answer.error, answer.error
        host = node.config.metadata_dir / f"{claim.uid}_npu.json"
        objects = [json.loads(part) for part in _split(host.read_text())]
        assert [o["apiVersion"].rsplit("/", 1)[1] for o in objects] == ["v1beta1", "v1alpha1"]
        assert [d["name"] for d in objects[0]["requests"][0]["devices"]] == ["npu-0", "npu-1"]
        spec = node.spec(claim.uid)
        assert spec is not None
        mounts = [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]
        assert mounts == [
            document.mount(
                document.host_path(
                    PurePosixPath(node.config.metadata_dir),
                    claim_uid=claim.uid,
                    request="npu",
                ),
                document.container_path(
                    driver=DRIVER, claim="train", pod_claim_name=None, request="npu"
                ),
            )
        ]

        def entries() -> list[dict[str, Any]]:
            return _ours(node.api.get_object("resourceclaims", "train", namespace="default"))

        await node.eventually(lambda: len(entries()) == 2)
        by_device = {e["device"]: _conditions(e) for e in entries()}
        assert by_device == {
            "npu-0": {"Ready": "True", "Healthy": "True"},
            "npu-1": {"Ready": "True", "Healthy": "Unknown"},
        }
        await node.publish_health("npu-1", health_pb2.HEALTH_STATE_UNHEALTHY, message="ECC")
        await node.eventually(
            lambda: (
                {e["device"]: _conditions(e)["Healthy"] for e in entries()}
                == {"npu-0": "True", "npu-1": "False"}
            )
        )
        answer = (await kubelet.unprepare([claim])).claims[claim.uid]
        assert not answer.error, answer.error
        assert not host.exists()
        await node.eventually(lambda: entries() == [])


@pytest.mark.parametrize("kube", ["1.35"], indirect=True)
async def test_on_1_35_auto_writes_no_metadata_but_still_the_device_status(plugin_node):
    node = plugin_node
    await node.publish_inventory("npu-0")
    claim = node.allocate("train", ["npu-0"])
    async with node.registered() as (_, kubelet):
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert not answer.error, answer.error
        spec = node.spec(claim.uid)
        assert spec is not None
        assert "mounts" not in json.dumps(spec)
        assert not node.config.metadata_dir.exists()
        await node.eventually(
            lambda: (
                len(_ours(node.api.get_object("resourceclaims", "train", namespace="default"))) == 1
            )
        )


def _split(text: str) -> list[str]:
    """The objects of a JSON stream as text."""
    decoder, parts, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        _, end = decoder.raw_decode(text, at)
        parts.append(text[at:end])
        at = end
    return parts
