"""NVIDIA's CDI part for the nvml backend (kinds `gpu`, `mig`): container edits and rules (pure).

`/dev/nvidia<minor>` per device (its one numbered node; a device listing two fails);
`/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` once per spec;
`NVIDIA_VISIBLE_DEVICES=<UUIDs>` (one `GPU-` UUID per device). A MIG device gets its parent's
node plus the GI and CI access capabilities of its own instance (of the parent's minor,
numbered as `/proc/driver/nvidia-caps/mig-minors` numbers them, see `naming`; a partition's are
the ones read when it was made) and `NVIDIA_VISIBLE_DEVICES=MIG-<uuid>`. A MIG device that
exists is published with its UUID and capability nodes; an option made on demand
(`createdOnDemand`) gets the partition made for it at prepare; a MIG device with neither (no
UUID, no partition made for the claim) fails the claim rather than hand out the whole GPU.

The MIG management capabilities (`nvidia-cap1`, `nvidia-cap2`) are never handed out.
"""

from __future__ import annotations

import re

from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import naming
from shared.vendors.parts.cdi import (
    ContainerEdits,
    EditRules,
    Node,
    Own,
    foreign,
    host_paths,
    listed,
    visible,
)
from shared.vendors.parts.partitions import Partition

__all__ = ["CONTROL_NODES", "KINDS", "RULES", "edits"]

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
KINDS = frozenset({"gpu", "mig"})
VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
_NVIDIA_NODE = re.compile(r"/dev/nvidia([0-9]{1,5})", re.ASCII)
_CAP_NODE = re.compile(r"/dev/nvidia-caps/nvidia-cap([0-9]{1,7})", re.ASCII)
GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f-]{1,64}", re.ASCII)
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z/-]{1,96}", re.ASCII)
_PERCENT = r"(100|[1-9][0-9]?)"
# A GPU or MIG device by index or UUID, never a runtime keyword (`all`, `none`, `void`).
_NVIDIA_ID = r"(?!(?i:all|none|void)(,|$))[A-Za-z0-9][A-Za-z0-9/_.:-]{0,127}"


def _nvidia_nodes(device: inventory_pb2.Device, claim_uid: str) -> list[Node]:
    """`/dev/nvidia<minor>` of the GPU (of the parent GPU, for a MIG device), first; any other
    numbered node the device lists follows, for the allowlist to refuse."""
    numbered = [
        (n.path, n.host_path) for n in device.device_nodes if _NVIDIA_NODE.fullmatch(n.path)
    ]
    if numbered:
        return numbered
    if "index" in device.attributes:
        path = f"/dev/nvidia{device.attributes['index'].int}"
        return [(path, host_paths(device).get(path, ""))]
    raise ClaimError(
        f"claim {claim_uid}: gpu {device.name} has no /dev/nvidiaN node", claim_uid=claim_uid
    )


def _mig_caps(device: inventory_pb2.Device, minor: int) -> tuple[list[Node], frozenset[str]]:
    """The MIG device's capability nodes as published, and those of them that are its own
    instance's: one GI access of the parent GPU `minor`, and at most one CI access of that GI."""
    caps = [
        (n.path, n.host_path) for n in device.device_nodes if n.path.startswith(naming.CAPS_DIR)
    ]
    minors = sorted(int(m.group(1)) for p, _ in caps if (m := _CAP_NODE.fullmatch(p)))
    if len(minors) != len(caps) or not 1 <= len(minors) <= 2:
        return caps, frozenset()
    gi, cis = minors[0], minors[1:]
    # `mig-minors` numbering (`naming`): the GI access caps of GPU `minor`, each followed by
    # the access caps of its CIs.
    own_gi = any(
        gi == naming.gpu_instance_cap(minor, instance)
        for instance in range(naming.GPU_INSTANCES_PER_GPU)
    )
    if not own_gi or not all(gi < ci < gi + naming.CAPS_PER_GPU_INSTANCE for ci in cis):
        return caps, frozenset()
    return caps, frozenset(path for path, _ in caps)


def edits(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> ContainerEdits:
    """The container edits of one GPU or MIG device (`shared.vendors.parts.cdi.BackendEdits`)."""
    if device.kind not in KINDS:
        return foreign(device)
    hosts = host_paths(device)
    common = [(p, hosts.get(p, "")) for p in CONTROL_NODES]
    nodes = _nvidia_nodes(device, claim_uid)
    node = nodes[0]
    minor = node[0].removeprefix("/dev/nvidia")
    uuid = device.uuid or (device.attributes["uuid"].string if "uuid" in device.attributes else "")
    if device.kind == "gpu":
        shown = uuid or minor
        own = Own(
            nodes=frozenset({node[0]}),
            visible=visible(VISIBLE_ENV, shown)
            if GPU_UUID.fullmatch(shown) or shown == minor
            else frozenset(),
        )
        return ContainerEdits(env={VISIBLE_ENV: shown}, nodes=nodes, common=common, own=own)
    if partitioned:
        # The partition brings the capabilities of the instance made for the claim.
        return ContainerEdits(
            env={}, nodes=nodes, common=common, own=Own(nodes=frozenset({node[0]}))
        )
    if not uuid:
        raise ClaimError(
            f"claim {claim_uid}: MIG device {device.name} does not exist yet (no UUID) and no "
            "partition was made for it: the inventory publishes it neither as an existing MIG "
            "device nor as an option made on demand (createdOnDemand)",
            claim_uid=claim_uid,
        )
    mig = naming.mig_uuid(uuid)
    caps, own_caps = _mig_caps(device, int(minor))
    own = Own(
        nodes=frozenset({node[0]}) | own_caps,
        visible=visible(VISIBLE_ENV, mig) if _MIG_UUID.fullmatch(mig) else frozenset(),
    )
    return ContainerEdits(env={VISIBLE_ENV: mig}, nodes=[*nodes, *caps], common=common, own=own)


def partition_nodes(partition: Partition) -> frozenset[str]:
    """A MIG partition names the capabilities of the instance made for the claim."""
    return frozenset(path for path, _ in partition.device_nodes if path.startswith(naming.CAPS_DIR))


NODES = re.compile(
    r"/dev/(nvidia[0-9]{1,5}|nvidiactl|nvidia-uvm|nvidia-uvm-tools"
    # Capabilities 1 and 2 are MIG `config` and `monitor` (management of every MIG device of
    # the node): never a container's. A MIG device's own are its GI and CI access minors.
    r"|nvidia-caps/nvidia-cap([3-9]|[1-9][0-9]{1,6}))",
    re.ASCII,
)
NUMBERED = re.compile(r"/dev/nvidia[0-9]+|/dev/nvidia-caps/nvidia-cap[0-9]+", re.ASCII)
ENV = {
    VISIBLE_ENV: listed(_NVIDIA_ID),
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": re.compile(_PERCENT),
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": listed(r"[0-9]{1,3}=[0-9]{1,12}M"),
}
RULES = EditRules(
    nodes=(NODES,),
    env=ENV,
    visible=frozenset({VISIBLE_ENV}),
    numbered=(NUMBERED,),
    mps=True,
    partition_nodes=partition_nodes,
)
"""What the nvml backend may put into a container."""
