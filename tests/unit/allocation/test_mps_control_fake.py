"""The fake `nvidia-cuda-mps-control` behaves like the real one where the agent relies on it:
`-d` starts one daemon per pipe directory, the client speaks to it over stdin, `quit` ends it
and takes its socket, and each failure switch fails the way the agent must survive."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import mps_control


@pytest.fixture
def fake(short_tmp: Path) -> Iterator[Path]:
    binary = mps_control.install(short_tmp / "bin")
    yield binary
    mps_control.kill_all(short_tmp)


def _env(base: Path, devices: str = "GPU-a,GPU-b") -> dict[str, str]:
    (base / "pipe").mkdir(exist_ok=True)
    return {
        "PATH": os.environ["PATH"],
        "CUDA_MPS_PIPE_DIRECTORY": str(base / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(base / "log"),
        "CUDA_VISIBLE_DEVICES": devices,
    }


def _run(binary: Path, env: dict[str, str], *args: str, stdin: str = "") -> tuple[int, str, str]:
    done = subprocess.run(
        [str(binary), *args], input=stdin, capture_output=True, text=True, env=env, timeout=10
    )
    return done.returncode, done.stdout.strip(), done.stderr.strip()


def test_the_daemon_starts_once_per_pipe_directory_and_answers_its_commands(fake, short_tmp):
    env = _env(short_tmp)
    assert _run(fake, env, "-d")[0] == 0
    pipe = short_tmp / "pipe"
    assert (pipe / mps_control.SOCKET).exists()
    assert len(mps_control.pids(short_tmp)) == 1

    status, _, error = _run(fake, env, "-d")
    assert status == 1
    assert "already running" in error
    assert len(mps_control.pids(short_tmp)) == 1

    commands = (
        "set_default_active_thread_percentage 25\n"
        "set_default_device_pinned_mem_limit 1 2048M\n"
        "get_default_active_thread_percentage\n"
        "get_default_device_pinned_mem_limit 1\n"
    )
    assert _run(fake, env, stdin=commands) == (0, "25.0\n2048M", "")
    log = (short_tmp / "log" / "control.log").read_text()
    assert "Startup" in log
    assert "Cmd:set_default_active_thread_percentage 25" in log


def test_quit_ends_the_daemon_and_removes_its_socket(fake, short_tmp):
    env = _env(short_tmp)
    assert _run(fake, env, "-d")[0] == 0
    assert _run(fake, env, stdin="quit\n")[0] == 0
    for _ in range(200):
        if not (short_tmp / "pipe" / mps_control.SOCKET).exists():
            break
        subprocess.run(["sleep", "0.01"], check=True)
    assert not (short_tmp / "pipe" / mps_control.SOCKET).exists()
    assert mps_control.pids(short_tmp) == []
    assert "Exit" in (short_tmp / "log" / "control.log").read_text()


def test_the_client_without_a_daemon_fails(fake, short_tmp):
    status, _, error = _run(fake, _env(short_tmp), stdin="get_server_list\n")
    assert status == 1
    assert error == "Cannot find MPS control daemon process"


@pytest.mark.parametrize(
    "command",
    [
        "set_default_active_thread_percentage 0",
        "set_default_active_thread_percentage 101",
        "set_default_device_pinned_mem_limit 2 1G",  # two devices: 0 and 1
        "set_default_device_pinned_mem_limit 0 lots",
        "frobnicate",
    ],
)
def test_a_refused_command_fails_the_client(fake, short_tmp, command):
    env = _env(short_tmp)
    assert _run(fake, env, "-d")[0] == 0
    status, _, error = _run(fake, env, stdin=command + "\n")
    assert status == 1
    assert error.startswith("error: ")


def test_a_missing_pipe_directory_fails_the_start(fake, short_tmp):
    env = _env(short_tmp)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(short_tmp / "absent")
    status, _, error = _run(fake, env, "-d")
    assert status == 1
    assert "does not exist" in error


def test_failure_switches(fake, short_tmp):
    env = _env(short_tmp)
    failures = fake.parent / "failures"
    failures.write_text("start")
    assert _run(fake, env, "-d")[0] == 1
    assert "failed to start" in (short_tmp / "log" / "control.log").read_text()

    failures.write_text("commands,quit")
    assert _run(fake, env, "-d")[0] == 0
    assert _run(fake, env, stdin="set_default_active_thread_percentage 50\n")[0] == 1
    assert _run(fake, env, stdin="quit\n")[0] == 0
    assert _run(fake, env, stdin="get_server_list\n")[0] == 0  # still there
