"""Fixtures of the discovery unit tests: an 8-GPU H100 node's inventory with every MIG profile."""

from __future__ import annotations

import pytest

from services.discovery import inventory
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.nvml import FakeNVML

H100_ALL_PROFILES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@pytest.fixture
async def h100_mig_inventory() -> inventory_pb2.Inventory:
    """8 H100s, each whole and in every MIG placement, with one counter set per GPU."""
    backend = nvml.NvmlBackend.open(
        FakeNVML.node("H100-80GB", count=8),
        options=nvml.NvmlOptions(mig_profiles=H100_ALL_PROFILES, pci_bus_id=True),
        sysfs=Sysfs("/nonexistent"),
    )
    scan = await backend.scan()
    identity = inventory.Identity(driver="gpu.dra-suite.io", node="n1", pool="n1", backend="nvml")
    return inventory.build(scan, identity=identity, scanned_unix_ms=0)
