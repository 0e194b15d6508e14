"""Huawei Ascend's CDI part (kind `npu`): container edits and allowlist rules (pure).

`/dev/davinci<id>` per device, `<id>` from the device's name (`npu-<id>`, as discovery names
it; an `index` attribute is not read); `/dev/davinci_manager`, `/dev/devmm_svm`,
`/dev/hisi_hdc` once per spec (spec-level edits); `ASCEND_VISIBLE_DEVICES=<ids of the
request>`. A vNPU (chip name `...vir...`) is `/dev/vdavinci<id>` on the host, seen as
`/dev/davinci<id>`, with `ASCEND_RUNTIME_OPTIONS=VIRTUAL`. Ascend has no runtime-enforced
memory limit variable (docs/hardware.md §3.5 names none).
"""

from __future__ import annotations

import re

from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.cdi import (
    ContainerEdits,
    EditRules,
    Own,
    device_number,
    foreign,
    host_paths,
    listed,
    made_on_demand,
    visible,
)
from shared.vendors.parts.partitions import Partition

__all__ = ["CONTROL_NODES", "KINDS", "RULES", "edits"]

CONTROL_NODES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
KINDS = frozenset({"npu"})
VISIBLE_ENV = "ASCEND_VISIBLE_DEVICES"
_VNPU_CHIP = re.compile(r"vir[0-9]+", re.ASCII)


def edits(device: inventory_pb2.Device, *, claim_uid: str, partitioned: bool) -> ContainerEdits:
    """The container edits of one NPU (`shared.vendors.parts.cdi.BackendEdits`)."""
    if device.kind not in KINDS:
        return foreign(device)
    # The name the claim was allocated, as discovery names the chip; never an attribute. A
    # vNPU template option is no device yet: its chip's nodes, which its vNPU's replace.
    if made_on_demand(device) and not (partitioned and device.parent):
        raise ClaimError(
            f"claim {claim_uid}: vNPU {device.name} is made at prepare (createdOnDemand) and "
            "no partition was made for it",
            claim_uid=claim_uid,
        )
    device_id = device_number(device.parent if made_on_demand(device) else device.name)
    if device_id is None:
        raise ClaimError(
            f"claim {claim_uid}: npu {device.name} has no device id", claim_uid=claim_uid
        )
    hosts = host_paths(device)
    path = f"/dev/davinci{device_id}"
    host = hosts.get(path, "")
    env = {VISIBLE_ENV: device_id}
    attributes = device.attributes
    chip = attributes["chipName"].string if "chipName" in attributes else ""
    if _VNPU_CHIP.search(chip):
        host = host or f"/dev/vdavinci{device_id}"
        env["ASCEND_RUNTIME_OPTIONS"] = "VIRTUAL"
    common = [(p, hosts.get(p, "")) for p in CONTROL_NODES]
    own = Own(nodes=frozenset({path}), visible=visible(VISIBLE_ENV, device_id))
    return ContainerEdits(env=env, nodes=[(path, host)], common=common, own=own)


def partition_nodes(partition: Partition) -> frozenset[str]:
    """A vNPU names its own node, numbered by its id."""
    if partition.id.isascii() and partition.id.isdigit():
        return frozenset({f"/dev/davinci{partition.id}"})
    return frozenset()


NODES = re.compile(r"/dev/(davinci[0-9]{1,5}|davinci_manager|devmm_svm|hisi_hdc)", re.ASCII)
NUMBERED = re.compile(r"/dev/davinci[0-9]+", re.ASCII)
ENV = {
    VISIBLE_ENV: listed(r"[0-9]{1,5}"),
    "ASCEND_RUNTIME_OPTIONS": re.compile(r"VIRTUAL"),
}
RULES = EditRules(
    nodes=(NODES,),
    env=ENV,
    visible=frozenset({VISIBLE_ENV}),
    numbered=(NUMBERED,),
    # A static vNPU: host /dev/vdavinci<N> is the container's /dev/davinci<N> (docs/hardware.md
    # §3.5).
    host_aliases=((re.compile(r"/dev/davinci([0-9]{1,5})", re.ASCII), r"/dev/vdavinci\1"),),
    partition_nodes=partition_nodes,
)
"""What the ascend backend may put into a container."""
