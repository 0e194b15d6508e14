"""Child processes of the local stack: started with logs to a file, stopped with a deadline.

Each child runs in its own process group, so a Ctrl-C in the terminal reaches only the
process that started it, which then stops them in order (agents first, then the bus).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["ChildProcess", "devcluster_env"]


def devcluster_env() -> dict[str, str]:
    """This process's environment, in which `python -m devcluster.<module>` finds the package
    from any working directory: the dev cluster is not installed, it runs from its checkout."""
    checkout = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@dataclass
class ChildProcess:
    """One agent (or the API emulator) as a real OS process."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    own_process_group: bool = True
    """Start it in a process group of its own (the terminal's signals pass it by)."""
    capture_stdout: bool = True
    """Stdout as a pipe for `read_line_until`; False sends it to the log with stderr."""
    _process: asyncio.subprocess.Process | None = None
    _log: IO[bytes] | None = None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdout=asyncio.subprocess.PIPE if self.capture_stdout else self._log,
            stderr=self._log,
            env=self.env or None,
            process_group=0 if self.own_process_group else None,
        )

    async def read_line_until(self, marker: str, *, timeout_s: float) -> str:
        """Read stdout until a line containing `marker` (a ready line) appears."""
        assert self._process is not None
        assert self._process.stdout is not None
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self._process.stdout.readline()
                if not raw:
                    raise RuntimeError(
                        f"{self.name} exited before printing {marker!r}; see {self.log_path}"
                    )
                line = raw.decode().strip()
                if marker in line:
                    return line

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    async def stop(
        self, *, grace_s: float = 10.0, sig: signal.Signals = signal.SIGTERM
    ) -> int | None:
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)
                try:
                    await asyncio.wait_for(process.wait(), grace_s)
                except TimeoutError:
                    process.kill()
                    await process.wait()
            if process.stdout is not None:
                with contextlib.suppress(Exception):
                    await process.stdout.read()
        if self._log is not None:
            self._log.close()
            self._log = None
        return process.returncode if process else None

    async def kill(self) -> None:
        """SIGKILL, as a crash would."""
        await self.stop(grace_s=5.0, sig=signal.SIGKILL)
