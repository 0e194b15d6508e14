"""A stand-in for `nvidia-cuda-mps-control`, run as a program (standard library only).

Like the real tool it reads `CUDA_MPS_PIPE_DIRECTORY` (default /tmp/nvidia-mps),
`CUDA_MPS_LOG_DIRECTORY` (default /var/log/nvidia-mps) and `CUDA_VISIBLE_DEVICES`:

- `-d`: start the control daemon in the background and return once it listens. The daemon
  owns `<pipe>/control` (a unix socket) and `<pipe>/nvidia-cuda-mps-control.pid`, and logs
  `Startup`, each command and `Exit` to `<log>/control.log`. A second `-d` on the same pipe
  directory fails ("An instance of this daemon is already running"); a missing pipe directory
  fails too. `-f` runs the daemon in the foreground.
- no argument: the client. It sends each line of stdin to the daemon and prints the answers;
  without a daemon it fails ("Cannot find MPS control daemon process"), and a command the
  daemon refuses makes it exit 1 after printing the error.

Commands: `get_server_list`, `set_default_active_thread_percentage <p>` (0 < p <= 100),
`get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit <dev> <n>M|G`
(`dev` an index into CUDA_VISIBLE_DEVICES), `get_default_device_pinned_mem_limit <dev>`, `quit`.

Failures, read at each step from the file `FAKE_MPS_CONTROL_FAILURES` names (comma-separated;
`install` points it at `<directory>/failures`, which the test writes): `start` (the daemon
never comes up), `commands` (every `set_*` is refused), `quit` (the daemon ignores `quit`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["FAIL_ENV", "PID_FILE", "SOCKET", "ask", "install", "kill_all", "pids"]

FAIL_ENV = "FAKE_MPS_CONTROL_FAILURES"
SOCKET = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
_END = b"\x00"
_ERROR = "error: "
_LIMIT = re.compile(r"[0-9]{1,12}[MG]")


def install(directory: Path) -> Path:
    """Write an executable `nvidia-cuda-mps-control` into `directory` that runs this fake with
    the current interpreter; its failures come from `<directory>/failures` (see module doc)."""
    directory.mkdir(parents=True, exist_ok=True)
    failures = directory / "failures"
    failures.touch()
    binary = directory / "nvidia-cuda-mps-control"
    binary.write_text(
        f'#!/bin/sh\n{FAIL_ENV}={failures} exec {sys.executable} {Path(__file__).resolve()} "$@"\n'
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


def ask(binary: str, pipe: Path, log: Path, commands: str) -> str:
    """What the daemon of `pipe` answers to `commands`, asked through `binary` as a client."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(log),
    }
    done = subprocess.run(
        [binary], input=commands, capture_output=True, text=True, env=env, check=True, timeout=10
    )
    return done.stdout.strip()


def pids(root: Path) -> list[int]:
    """The daemons running with a pipe directory anywhere under `root`."""
    found = []
    for pid_file in sorted(root.rglob(PID_FILE)):
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            continue
        found.append(pid)
    return found


def kill_all(root: Path) -> None:
    """SIGKILL every daemon under `root` (a test's teardown), as a crashed node would lose them."""
    for pid in pids(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _failures() -> set[str]:
    try:
        text = Path(os.environ[FAIL_ENV]).read_text()
    except (KeyError, OSError):
        return set()
    return {f.strip() for f in text.split(",") if f.strip()}


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))


def _log(message: str) -> None:
    with (_log_dir() / "control.log").open("a") as log:
        log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")


def _connect() -> socket.socket | None:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(_pipe_dir() / SOCKET))
    except OSError:
        client.close()
        return None
    return client


class _Daemon:
    def __init__(self) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.devices = len([d for d in visible.split(",") if d]) if visible else 1
        self.percentage = 100.0
        self.pinned: dict[int, str] = {}

    def answer(self, line: str) -> tuple[str, bool]:
        """(reply, quit)."""
        words = line.split()
        name, args = (words[0], words[1:]) if words else ("", [])
        _log(f"Cmd:{line}")
        failures = _failures()
        if name.startswith("set_") and "commands" in failures:
            return f"{_ERROR}{name} failed", False
        if name == "quit":
            return "", "quit" not in failures
        if name == "get_server_list":
            return "", False
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.percentage:.1f}", False
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            return self._set_percentage(args[0]), False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            device = self._device(args[0])
            if device is None:
                return f"{_ERROR}invalid device {args[0]}", False
            return self.pinned.get(device, ""), False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            device = self._device(args[0])
            if device is None or not _LIMIT.fullmatch(args[1]):
                return f"{_ERROR}invalid device or limit {' '.join(args)}", False
            self.pinned[device] = args[1]
            return "", False
        return f"{_ERROR}unrecognized command {line!r}", False

    def _set_percentage(self, value: str) -> str:
        try:
            percentage = float(value)
        except ValueError:
            percentage = -1.0
        if not 0 < percentage <= 100:
            return f"{_ERROR}invalid percentage {value}"
        self.percentage = percentage
        return ""

    def _device(self, value: str) -> int | None:
        return int(value) if value.isdigit() and int(value) < self.devices else None

    def serve(self, server: socket.socket) -> None:
        while True:
            connection, _ = server.accept()
            with connection, connection.makefile("rb") as lines:
                for raw in lines:
                    line = raw.decode().strip()
                    if not line:
                        continue
                    reply, stop = self.answer(line)
                    connection.sendall(reply.encode() + _END)
                    if stop:
                        return


def _listen() -> socket.socket | str:
    """The daemon's socket, or why it cannot run."""
    pipe = _pipe_dir()
    if not pipe.is_dir():
        return f"pipe directory {pipe} does not exist"
    if "start" in _failures():
        return "failed to start: cannot initialise NVML"
    running = _connect()
    if running is not None:
        running.close()
        return "An instance of this daemon is already running"
    path = pipe / SOCKET
    path.unlink(missing_ok=True)  # a stale socket of a daemon that died
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def _run_daemon(server: socket.socket) -> None:
    pipe = _pipe_dir()
    (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
    _log("Startup")
    try:
        _Daemon().serve(server)
    finally:
        server.close()
        (pipe / SOCKET).unlink(missing_ok=True)
        (pipe / PID_FILE).unlink(missing_ok=True)
        _log("Exit")


def _daemon(*, foreground: bool) -> int:
    _log_dir().mkdir(parents=True, exist_ok=True)
    server = _listen()
    if isinstance(server, str):
        _log(server)
        print(server, file=sys.stderr)
        return 1
    if foreground:
        _run_daemon(server)
        return 0
    if os.fork() != 0:
        return 0  # the socket already listens: a client may connect at once
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _run_daemon(server)
    os._exit(0)


def _client() -> int:
    connection = _connect()
    if connection is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    status = 0
    with connection:
        for raw in sys.stdin:
            line = raw.strip()
            if not line:
                continue
            connection.sendall(line.encode() + b"\n")
            reply = _receive(connection)
            if reply is None:
                break  # the daemon quit
            if reply.startswith(_ERROR):
                print(reply, file=sys.stderr)
                status = 1
            elif reply:
                print(reply)
    return status


def _receive(connection: socket.socket) -> str | None:
    data = b""
    while not data.endswith(_END):
        chunk = connection.recv(4096)
        if not chunk:
            return data.decode() if data else None
        data += chunk
    return data[:-1].decode()


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return _daemon(foreground=False)
    if argv == ["-f"]:
        return _daemon(foreground=True)
    if not argv:
        return _client()
    print(f"usage: nvidia-cuda-mps-control [-d | -f], not {' '.join(argv)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
