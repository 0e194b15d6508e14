"""One kubelet front per node: find the other front of this driver serving on this node.

A node runs either the DRA front (registration socket `<driver>-reg.sock`) or the
device-plugin front (`<driver>-<resource>.sock` in the device plugin directory), never both:
the kubelet would hand the same devices out twice. A socket counts only while something
accepts connections on it; a file left by a crashed agent does not.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

__all__ = ["device_plugin_front", "dra_front", "serving"]

_CONNECT_TIMEOUT_S = 1.0


async def serving(path: Path) -> bool:
    """True when a process accepts connections on the unix socket `path`."""
    if not await asyncio.to_thread(path.is_socket):
        return False
    try:
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_unix_connection(str(path))
    except (OSError, TimeoutError):
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def dra_front(registration_socket: Path) -> str | None:
    """Why the device-plugin front must not start: the DRA front's registration is live."""
    if await serving(registration_socket):
        return (
            f"the DRA front of this driver serves on this node ({registration_socket}); "
            "a node runs one kubelet front: drain it and switch its label first"
        )
    return None


async def device_plugin_front(plugin_dir: Path, *, driver: str) -> str | None:
    """Why the DRA front must not start: a device-plugin front of `driver` is live."""
    for path in await asyncio.to_thread(_sockets, plugin_dir, driver):
        if await serving(path):
            return (
                f"the device-plugin front of this driver serves on this node ({path}); "
                "a node runs one kubelet front: drain it and switch its label first"
            )
    return None


def _sockets(plugin_dir: Path, driver: str) -> list[Path]:
    return sorted(plugin_dir.glob(f"{driver}-*.sock"))
