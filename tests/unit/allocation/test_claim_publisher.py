"""The prepared-claims KV value: what the allocation agent tells the health agent and dractl
about a claim it prepared (pure part; the writer runs against a real nats-server in
tests/integration/allocation/test_prepared_claims.py)."""

from __future__ import annotations

from services.allocation.claim.checkpoint import (
    ClaimState,
    PreparedClaim,
    PreparedDevice,
    PreparedVfio,
)
from services.allocation.claim.claims import PodRef
from services.allocation.dra.claim_publisher import to_message
from shared.pb.drasuite.v1 import claim_pb2


def test_the_value_names_the_claim_its_devices_and_its_pods():
    record = PreparedClaim(
        uid="uid-1",
        namespace="team-a",
        name="train",
        driver="sim.dra-suite.io",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(
            PreparedDevice(
                request_names=("npu",),
                pool="node-a",
                device="npu-0",
                cdi_device_ids=("k8s.sim.dra-suite.io/claim=uid-1-npu-0",),
            ),
            PreparedDevice(
                request_names=("shared",),
                pool="node-a",
                device="npu-1",
                cdi_device_ids=("k8s.sim.dra-suite.io/claim=uid-1-npu-1-0f5a9d1e",),
                share_id="0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6",
            ),
        ),
    )
    pods = [PodRef(namespace="team-a", name="trainer-0", uid="p-0")]
    message = to_message(record, node="node-a", pods=pods, prepared_unix_ms=1_700_000_000_000)
    assert (message.driver, message.node, message.claim_uid) == (
        "sim.dra-suite.io",
        "node-a",
        "uid-1",
    )
    assert (message.namespace, message.name) == ("team-a", "train")
    assert message.state == claim_pb2.PREPARED_CLAIM_STATE_PREPARED
    assert message.prepared_unix_ms == 1_700_000_000_000
    assert [(list(d.request_names), d.device, d.share_id) for d in message.devices] == [
        (["npu"], "npu-0", ""),
        (["shared"], "npu-1", "0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6"),
    ]
    assert list(message.devices[1].cdi_device_ids) == list(record.devices[1].cdi_device_ids)
    assert [(p.namespace, p.name, p.uid) for p in message.pods] == [("team-a", "trainer-0", "p-0")]
    # Devices for containers: nothing passed through.
    assert {d.passthrough for d in message.devices} == {claim_pb2.DEVICE_PASSTHROUGH_NONE}


def test_a_device_bound_to_vfio_pci_is_marked_passed_through():
    def device(name: str) -> PreparedDevice:
        return PreparedDevice(
            request_names=("gpu",),
            pool="node-a",
            device=name,
            cdi_device_ids=(f"k8s.sim.dra-suite.io/claim=uid-2-{name}",),
        )

    record = PreparedClaim(
        uid="uid-2",
        namespace="vms",
        name="vm-gpu",
        driver="sim.dra-suite.io",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(device("gpu-0"), device("gpu-1")),
        vfio=(PreparedVfio(device="gpu-1", pci_bus_id="0000:3b:00.0", iommu_group=21),),
    )
    message = to_message(record, node="node-a", pods=(), prepared_unix_ms=1)
    assert [(d.device, d.passthrough) for d in message.devices] == [
        ("gpu-0", claim_pb2.DEVICE_PASSTHROUGH_NONE),
        ("gpu-1", claim_pb2.DEVICE_PASSTHROUGH_VFIO),
    ]
    # On the wire, as the health agent reads it.
    decoded = claim_pb2.PreparedClaim.FromString(message.SerializeToString())
    assert decoded.devices[1].passthrough == claim_pb2.DEVICE_PASSTHROUGH_VFIO
