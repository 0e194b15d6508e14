"""The MPS control daemons of prepared claims: child processes of the allocation agent running
the host's `nvidia-cuda-mps-control` (a setting; tests point it at tests/fakes/mps_control.py).

`ensure` is idempotent by claim UID: a daemon already answering in the claim's pipe directory
(one a restarted agent left behind) is adopted and given the claim's limits again, never
started a second time; otherwise `-d` starts one and the limits are sent to it. `stop` sends
`quit`, waits until the daemon's socket is gone and removes the claim's directories; a claim
without a daemon stops cleanly. Every failure is the claim's `ClaimError`, naming the command
and what the daemon's `control.log` said last.

The daemon gets only the environment it needs (the MPS variables, CUDA_VISIBLE_DEVICES with
the claim's GPUs, PATH and the library path), never the agent's own (NATS credentials).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import structlog

from services.allocation.claim.checkpoint import PreparedMps
from services.allocation.mps import layout
from shared.errors import ClaimError

__all__ = ["CONTROL_SOCKET", "MpsDaemons"]

log = structlog.get_logger(__name__)

CONTROL_SOCKET = "control"
"""The daemon's socket in its pipe directory: there while it runs."""
_DIR_MODE = 0o755  # the container's user, whoever that is, must reach the socket
_POLL_S = 0.02
_PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "LANG")
_PROBE = "get_server_list"


class MpsDaemons:
    def __init__(self, root: Path, *, binary: str, timeout_s: float = 10.0) -> None:
        """`root`: the driver's own MPS directory (`<plugin data dir>/mps`)."""
        self.root = root
        self.binary = binary
        self.timeout_s = timeout_s

    @property
    def mount_root(self) -> PurePosixPath:
        """The directory every MPS mount must come from (the allowlist's root)."""
        return PurePosixPath(self.root)

    def directories(self, claim_uid: str) -> tuple[Path, Path]:
        pipe, log_dir = layout.host_dirs(self.mount_root, claim_uid)
        return Path(pipe), Path(log_dir)

    def claim_uids(self) -> list[str]:
        """Claims that have a directory here (a daemon, or what one left)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def listening(self, claim_uid: str) -> bool:
        """Whether the claim's daemon socket is there (cheap; `running` asks the daemon)."""
        pipe, _ = self.directories(claim_uid)
        return (pipe / CONTROL_SOCKET).exists()

    async def running(self, claim_uid: str) -> bool:
        """Whether a daemon answers in the claim's pipe directory."""
        if not self.listening(claim_uid):
            return False
        status, _ = await self._run(claim_uid, [], commands=[_PROBE], devices=())
        return status == 0

    async def ensure(self, claim_uid: str, mps: PreparedMps) -> bool:
        """The claim's daemon runs with its limits; True when it was started, False adopted."""
        pipe, log_dir = self.directories(claim_uid)
        for directory in (pipe, log_dir):
            await asyncio.to_thread(directory.mkdir, mode=_DIR_MODE, parents=True, exist_ok=True)
        started = not await self.running(claim_uid)
        if started:
            status, detail = await self._run(claim_uid, ["-d"], commands=(), devices=mps.devices)
            if status != 0:
                raise self._error(claim_uid, "start", status, detail)
            log.info("mps_daemon_started", claim_uid=claim_uid, devices=list(mps.devices))
        else:
            log.warning("mps_daemon_adopted", claim_uid=claim_uid)
        commands = _limit_commands(mps)
        if commands:
            status, detail = await self._run(claim_uid, [], commands=commands, devices=())
            if status != 0:
                error = self._error(claim_uid, "set limits", status, detail)
                with contextlib.suppress(ClaimError):
                    await self.stop(claim_uid)
                raise error
        return started

    async def stop(self, claim_uid: str) -> bool:
        """Quit the claim's daemon and remove its directories; False when there was none."""
        directory = self.root / claim_uid
        if not directory.exists():
            return False
        if await self.running(claim_uid):
            status, detail = await self._run(claim_uid, [], commands=["quit"], devices=())
            if status != 0:
                raise self._error(claim_uid, "quit", status, detail)
            await self._gone(claim_uid)
            log.info("mps_daemon_stopped", claim_uid=claim_uid)
        await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
        return True

    async def _gone(self, claim_uid: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while self.listening(claim_uid):
            if loop.time() >= deadline:
                raise ClaimError(
                    f"claim {claim_uid}: the MPS control daemon did not quit within "
                    f"{self.timeout_s:g}s (its socket is still there)",
                    claim_uid=claim_uid,
                )
            await asyncio.sleep(_POLL_S)

    def _environment(self, claim_uid: str, devices: Sequence[str]) -> dict[str, str]:
        pipe, log_dir = self.directories(claim_uid)
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env[layout.PIPE_DIR_ENV] = str(pipe)
        env[layout.LOG_DIR_ENV] = str(log_dir)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        return env

    async def _run(
        self,
        claim_uid: str,
        args: Sequence[str],
        *,
        commands: Sequence[str],
        devices: Sequence[str],
    ) -> tuple[int, str]:
        """(exit status, its last line of output) of one run of the control binary. The
        daemon (`-d`) keeps no pipe of ours open: its output goes to /dev/null."""
        stdin = "".join(f"{command}\n" for command in commands).encode() if commands else None
        piped = asyncio.subprocess.PIPE if not args else asyncio.subprocess.DEVNULL
        try:
            process = await asyncio.create_subprocess_exec(
                self.binary,
                *args,
                stdin=asyncio.subprocess.PIPE if commands else asyncio.subprocess.DEVNULL,
                stdout=piped,
                stderr=piped,
                env=self._environment(claim_uid, devices),
                start_new_session=True,
            )
        except OSError as exc:
            return 127, f"cannot run {self.binary}: {exc.strerror or exc}"
        try:
            async with asyncio.timeout(self.timeout_s):
                stdout, stderr = await process.communicate(stdin)
        except TimeoutError:
            return 124, f"no answer within {self.timeout_s:g}s"
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        text = (stderr or b"").decode(errors="replace").strip() or (stdout or b"").decode(
            errors="replace"
        ).strip()
        return process.returncode or 0, text.splitlines()[-1] if text else ""

    def _error(self, claim_uid: str, step: str, status: int, detail: str) -> ClaimError:
        said = detail or self._last_logged(claim_uid) or "no message"
        return ClaimError(
            f"claim {claim_uid}: MPS control daemon: {step} failed "
            f"({self.binary}, exit status {status}): {said}",
            claim_uid=claim_uid,
        )

    def _last_logged(self, claim_uid: str) -> str:
        _, log_dir = self.directories(claim_uid)
        try:
            lines = (log_dir / "control.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""


def _limit_commands(mps: PreparedMps) -> list[str]:
    commands = []
    if mps.thread_percentage is not None:
        commands.append(f"set_default_active_thread_percentage {mps.thread_percentage}")
    for index, mib in enumerate(mps.pinned_mib):
        if mib is not None:
            commands.append(f"set_default_device_pinned_mem_limit {index} {mib}M")
    return commands
