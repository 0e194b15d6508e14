"""NVIDIA device names and identities (pure): what discovery publishes and the others read back.

- A whole GPU is `gpu-<index>` (NVML's index); the health monitor names its faults so.
- A MIG slot, an existing MIG device or a placement made when a claim gets it, is
  `<gpu>-mig-<profile>-<GI profile id>-<placement start>`: the profile lower-case without dots,
  other characters outside RFC 1123 as `-` (`gpu-0-mig-1g10gb-me-20-3`, as NVIDIA's driver
  names them). One slot has one name, whether its MIG device exists or not.
- A MIG device's UUID is `MIG-<uuid>`; older drivers report it without the prefix.
- MIG capability device nodes are `/dev/nvidia-caps/nvidia-cap<N>`, numbered as
  `/proc/driver/nvidia-caps/mig-minors` numbers them: `config` 1, `monitor` 2, then per GPU
  minor 15 GPU instances of 9 minors each, the GI's `access` followed by its 8 CIs' `access`
  (docs/hardware.md §1.3).
"""

from __future__ import annotations

import re

__all__ = [
    "CAPS_DIR",
    "CAPS_PER_GPU_INSTANCE",
    "FIRST_GPU_INSTANCE_CAP",
    "GPU_INSTANCES_PER_GPU",
    "caps_node",
    "compute_instance_cap",
    "counter_set_name",
    "gpu_index",
    "gpu_instance_cap",
    "gpu_name",
    "mig_name",
    "mig_slot",
    "mig_uuid",
]

CAPS_DIR = "/dev/nvidia-caps/"
FIRST_GPU_INSTANCE_CAP = 3
CAPS_PER_GPU_INSTANCE = 9
GPU_INSTANCES_PER_GPU = 15
_GPU = re.compile(r"gpu-(0|[1-9][0-9]{0,4})", re.ASCII)
_NOT_RFC1123 = re.compile(r"[^a-z0-9-]")
_MIG_SLOT = re.compile(r"-mig-.+-(\d+)-(\d+)", re.ASCII)


def gpu_name(index: int) -> str:
    """The device name of GPU `index`: `gpu-3`."""
    return f"gpu-{index}"


def gpu_index(name: str) -> int | None:
    """`gpu-3` -> 3; None for any other name (a MIG device's included)."""
    match = _GPU.fullmatch(name)
    return int(match.group(1)) if match is not None else None


def mig_name(gpu: str, profile: str, profile_id: int, start: int) -> str:
    """`gpu-0-mig-1g10gb-me-20-3`: the MIG slot of `profile` (`1g.10gb+me`) at `start`."""
    canonical = _NOT_RFC1123.sub("-", profile.replace(".", "").lower())
    return f"{gpu}-mig-{canonical}-{profile_id}-{start}"


def mig_slot(name: str, gpu: str) -> tuple[int, int] | None:
    """(GI profile id, placement start) of a MIG slot named after `gpu`; None otherwise."""
    if not name.startswith(gpu):
        return None
    match = _MIG_SLOT.fullmatch(name, len(gpu))
    return (int(match.group(1)), int(match.group(2))) if match is not None else None


def counter_set_name(gpu: str) -> str:
    """The shared counter set of a GPU's MIG slots: `gpu-0-counter-set`."""
    return f"{gpu}-counter-set"


def mig_uuid(uuid: str) -> str:
    """A MIG device's UUID with its `MIG-` prefix, as `NVIDIA_VISIBLE_DEVICES` takes it."""
    return uuid if uuid.startswith("MIG-") else f"MIG-{uuid}"


def gpu_instance_cap(gpu_minor: int, gpu_instance: int) -> int:
    """The capability minor of GPU instance `gpu_instance` of GPU `/dev/nvidia<gpu_minor>`."""
    return FIRST_GPU_INSTANCE_CAP + CAPS_PER_GPU_INSTANCE * (
        GPU_INSTANCES_PER_GPU * gpu_minor + gpu_instance
    )


def compute_instance_cap(gpu_minor: int, gpu_instance: int, compute_instance: int) -> int:
    """The capability minor of a compute instance of that GPU instance."""
    return gpu_instance_cap(gpu_minor, gpu_instance) + 1 + compute_instance


def caps_node(minor: int) -> str:
    """`/dev/nvidia-caps/nvidia-cap<minor>`."""
    return f"{CAPS_DIR}nvidia-cap{minor}"
