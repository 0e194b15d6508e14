"""The backend behind each driver name of the shipped overlays (tests/unit/deploy/manifests.py):
what `classgen` takes for a driver's nodes and `dractl classes --help` lists. Apart from
`classgen`, which loads the allocator, so that building dractl's parser does not."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BACKENDS"]

BACKENDS: Mapping[str, str] = {
    "sim.dra-suite.io": "sim",
    "gpu.dra-suite.io": "nvml",
    "npu.huawei.com": "ascend",
}
