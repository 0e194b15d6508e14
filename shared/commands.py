"""Running a hardware tool (npu-smi) as a subprocess, under a timeout: the command seam.

`CommandRunner` is what the agents' backends, monitors and partition managers call; tests pass
a fake that returns captured output. The real runner never goes through a shell, kills the
command's whole process group on timeout or cancellation, and turns every failure (missing
binary, non-zero exit, timeout) into CommandFailedError naming the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Awaitable, Sequence
from typing import Protocol

__all__ = ["CommandFailedError", "CommandRunner", "run_command"]


class CommandFailedError(Exception):
    """The command could not be run, failed or timed out; the message says which and why."""


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], *, timeout_s: float) -> Awaitable[str]:
        """The command's stdout as text; CommandFailedError when it did not succeed."""
        ...


async def run_command(argv: Sequence[str], *, timeout_s: float) -> str:
    """Run `argv` (no shell) and return its stdout; CommandFailedError otherwise."""
    shown = shlex.join(argv)
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, killed as a whole
        )
    except OSError as exc:
        raise CommandFailedError(f"{shown}: cannot run: {exc.strerror or exc}") from exc
    try:
        async with asyncio.timeout(timeout_s):
            stdout, stderr = await process.communicate()
    except TimeoutError as exc:
        _kill_group(process)
        await process.wait()
        raise CommandFailedError(f"{shown}: no answer within {timeout_s}s") from exc
    finally:
        if process.returncode is None:  # cancelled: do not leave it behind
            _kill_group(process)
    if process.returncode != 0:
        # npu-smi prints some errors on stdout: the last line of whichever has any.
        lines = (stderr or stdout).decode(errors="replace").strip().splitlines()
        detail = lines[-1].strip() if lines else "no message"
        raise CommandFailedError(f"{shown}: exit status {process.returncode}: {detail}")
    return stdout.decode(errors="replace")


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the command and whatever it started (they hold its pipes open)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
