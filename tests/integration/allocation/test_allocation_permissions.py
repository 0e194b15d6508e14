"""File modes of everything the plugin creates, whatever the umask it was started with.

Sockets are owner-only (the kubelet runs as root); the checkpoint, the inventory copy and the
sim partition state are owner-only files in owner-only or group-readable directories; CDI
specs are world-readable (container runtimes read them) and their directory too. Nothing is
ever group- or world-writable, not even under umask 0, and a strict umask must not hide the
CDI specs from the runtime.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.allocation.cdi import spec_files
from shared.vendors import sim

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
PARTITION_CONFIG = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "DeviceConfig",
    "partition": {"profile": "vir05_1c_8g"},
}


@pytest.fixture(params=[0o000, 0o077], ids=["umask 000", "umask 077"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _created_by_the_plugin(base: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            yield Path(root, name)


async def test_modes_of_sockets_checkpoint_inventory_and_cdi_specs(plugin_node, umask):
    config = plugin_node.config
    async with plugin_node.registered() as (_, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1", "npu-2")
        await plugin_node.eventually(config.inventory_path.exists)
        plain = plugin_node.allocate("plain", ["npu-1"])
        partitioned = plugin_node.allocate("vnpu", ["npu-0"], parameters=PARTITION_CONFIG)
        answers = (await kubelet.prepare([plain, partitioned])).claims
        assert [answers[c.uid].error for c in (plain, partitioned)] == ["", ""]

        assert _mode(config.dra_socket_path) == 0o600
        assert _mode(config.registration_socket_path) == 0o600
        assert _mode(config.plugin_registry_dir) == 0o750
        assert _mode(config.data_dir) == 0o750
        assert _mode(config.data_dir.parent) == 0o750  # created on the way, same mode
        assert _mode(config.checkpoint_dir) == 0o700
        for claim in (plain, partitioned):
            assert _mode(config.checkpoint_dir / f"{claim.uid}.json") == 0o600
            assert _mode(config.cdi_root / spec_files.spec_file_name(DRIVER, claim.uid)) == 0o644
        assert _mode(config.inventory_path) == 0o600
        assert _mode(config.data_dir / sim.STATE_FILE) == 0o600
        assert _mode(config.cdi_root) == 0o755

        writable = [
            f"{path}: {oct(_mode(path))}"
            for path in _created_by_the_plugin(plugin_node.base)
            if _mode(path) & (stat.S_IWGRP | stat.S_IWOTH)
        ]
        assert writable == []
