"""Device nodes of NVIDIA capabilities (`/dev/nvidia-caps/nvidia-cap<N>`), made when missing.

A MIG device made at prepare time gets capability minors of its own. The driver makes no
device node for them (nvidia-modprobe does, usually once at boot), and a container runtime
fails a container whose CDI spec names a node that does not exist. So the agent makes the
node as nvidia-modprobe does: a character device of the `nvidia-caps` major from
`/proc/devices`, readable by all (0444: holding it open is what grants the capability).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CapsNodeError", "CapsNodes"]

_NODE_MODE = 0o444
_CHARACTER_SECTION = "Character devices:"


class CapsNodeError(Exception):
    """A capability node could not be made; the message names the node and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CapsNodes:
    directory: Path = Path("/dev/nvidia-caps")
    proc_devices: Path = Path("/proc/devices")
    make_node: Callable[[str, int, int], None] = field(default=os.mknod)
    """`os.mknod`; tests give a recorder (making character devices needs CAP_MKNOD)."""

    def major(self) -> int:
        """The `nvidia-caps` character major the loaded driver registered."""
        try:
            text = self.proc_devices.read_text()
        except OSError as exc:
            raise CapsNodeError(f"reading {self.proc_devices}: {exc.strerror or exc}") from exc
        in_characters = False
        for line in text.splitlines():
            if line.strip() == _CHARACTER_SECTION:
                in_characters = True
            elif line.strip().endswith("devices:"):
                in_characters = False
            elif in_characters and line.split()[1:] == ["nvidia-caps"]:
                return int(line.split()[0])
        raise CapsNodeError(f"{self.proc_devices} lists no nvidia-caps character device")

    def ensure(self, minor: int) -> Path:
        """The node of capability `minor`, made when missing; an impostor file is an error."""
        path = self.directory / f"nvidia-cap{minor}"
        major = self.major()
        try:
            found = path.stat()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CapsNodeError(f"checking {path}: {exc.strerror or exc}") from exc
        else:
            if stat.S_ISCHR(found.st_mode) and found.st_rdev == os.makedev(major, minor):
                return path
            raise CapsNodeError(
                f"{path} exists but is not the character device {major}:{minor} of nvidia-caps"
            )
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            self.make_node(str(path), stat.S_IFCHR | _NODE_MODE, os.makedev(major, minor))
            if path.exists():
                os.chmod(path, _NODE_MODE)  # mknod's mode passes through the umask
        except FileExistsError:
            return path  # made meanwhile by nvidia-modprobe or another instance
        except OSError as exc:
            raise CapsNodeError(f"making {path} ({major}:{minor}): {exc.strerror or exc}") from exc
        return path
