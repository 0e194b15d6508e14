"""The sim backend's CDI part (kinds `npu`, `gpu`, `mig`): container edits and rules (pure).

The device's nodes and env from the inventory, as published (sim nodes map to `/dev/null` on
the host, so no real control nodes are added), each numbered node and visible id bound to the
device's own number (`npu-<n>`, `gpu-<n>`, a MIG device's parent's). The sim imitates both
vendors' node names and variables (shared/sim/profiles), so its rules are the union of theirs,
always backed by `/dev/null` on the host.
"""

from __future__ import annotations

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import cdi as ascend
from shared.vendors.nvidia import cdi as nvidia
from shared.vendors.parts.cdi import ContainerEdits, EditRules, Own, device_number, foreign, visible
from shared.vendors.parts.partitions import Partition

__all__ = ["KINDS", "RULES", "edits"]

KINDS = ascend.KINDS | nvidia.KINDS


def edits(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> ContainerEdits:
    """The container edits of one sim device (`shared.vendors.parts.cdi.BackendEdits`)."""
    if device.kind not in KINDS:
        return foreign(device)
    number = device_number(device.parent if device.kind == "mig" else device.name)
    own = Own()
    if number is not None and device.kind in ascend.KINDS:
        own = Own(
            nodes=frozenset({f"/dev/davinci{number}"}),
            visible=visible(ascend.VISIBLE_ENV, number),
        )
    elif number is not None:
        uuid = device.uuid if nvidia.GPU_UUID.fullmatch(device.uuid) else number
        own = Own(
            nodes=frozenset({f"/dev/nvidia{number}"}),
            visible=visible(nvidia.VISIBLE_ENV, number, uuid)
            if device.kind == "gpu"
            else frozenset(),
        )
    nodes = [(n.path, n.host_path) for n in device.device_nodes]
    return ContainerEdits(env=dict(device.env), nodes=nodes, own=own)


def partition_nodes(partition: Partition) -> frozenset[str]:
    """Sim partitions imitate MIG devices and vNPUs: either vendor's own nodes."""
    return nvidia.partition_nodes(partition) | ascend.partition_nodes(partition)


RULES = EditRules(
    nodes=(ascend.NODES, nvidia.NODES),
    env={**ascend.ENV, **nvidia.ENV},
    visible=ascend.RULES.visible | nvidia.RULES.visible,
    numbered=(ascend.NUMBERED, nvidia.NUMBERED),
    sim_host=True,
    mps=True,
    partition_nodes=partition_nodes,
)
"""What the sim backend may put into a container."""
