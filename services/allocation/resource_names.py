"""Extended resource names (pure): the qualified-name rule and the overrides configured by kind.

The device-plugin front offers devices under these names (deviceplugin/resources.py); the
agent's settings parse the overrides before anything opens.
"""

from __future__ import annotations

import re

__all__ = ["RESOURCE_NAME", "parse_overrides"]

RESOURCE_NAME = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""An extended resource name: `<domain>/<name>` (the kubelet checks it is qualified)."""


def parse_overrides(text: str) -> dict[str, str]:
    """`npu=huawei.com/Ascend910,gpu=nvidia.com/gpu` -> mapping; ValueError on a bad entry."""
    overrides: dict[str, str] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        key, sep, name = entry.partition("=")
        if not sep or not key.strip() or not RESOURCE_NAME.match(name.strip()):
            raise ValueError(f"{entry!r} is not <kind or resource>=<domain>/<name>")
        overrides[key.strip()] = name.strip()
    return overrides
