"""A JetStream cluster of real nats-server processes on loopback, for tests and `devcluster up`.

Each server has its own client port, route port and store dir, chosen once and kept across
restarts, so a killed server comes back as the same cluster member. Routes stay on loopback
without TLS or route credentials: the deployment's routes have both (components/nats-cluster).
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from devcluster.natsauth import ServerAuth
from devcluster.natsserver import NATSServerError, NATSServerProcess

__all__ = ["NATSCluster", "free_port"]

CLUSTER_NAME = "dra-dev"
_PORT_ATTEMPTS = 3


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (routes need ports known up front)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NATSCluster:
    """`size` nats-servers routed to each other; `servers[i]` is a plain `NATSServerProcess`."""

    def __init__(
        self,
        root: Path,
        *,
        size: int = 3,
        auth: ServerAuth | None = None,
        own_process_group: bool = False,
        keep_logs: bool = False,
    ) -> None:
        """`keep_logs`: each server appends its whole log to `nats-server.log` in its store."""
        if size < 1:
            raise ValueError(f"a cluster needs at least one server, not {size}")
        self._root, self._size = root, size
        self._auth, self._own_process_group = auth, own_process_group
        self._keep_logs = keep_logs
        self._assign_ports()

    def _assign_ports(self) -> None:
        """Free ports for every server's clients, routes and monitoring (routes name them
        all up front, so the servers cannot pick their own)."""
        size, root = self._size, self._root
        route_ports = [free_port() for _ in range(size)]
        self.monitor_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats://127.0.0.1:{port}" for port in route_ports)
        self.servers = [
            NATSServerProcess(
                root / f"n{index}",
                port=free_port(),
                auth=self._auth,
                own_process_group=self._own_process_group,
                log_file=root / f"n{index}" / "nats-server.log" if self._keep_logs else None,
                extra_args=(
                    *("--server_name", f"n{index}", "--cluster_name", CLUSTER_NAME),
                    *("--cluster", f"nats://127.0.0.1:{route_ports[index]}"),
                    *("--routes", routes),
                    *("--http_port", str(self.monitor_ports[index])),
                ),
            )
            for index in range(size)
        ]

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated, as agents take them (`--nats-url`)."""
        return ",".join(server.url for server in self.servers)

    @property
    def running(self) -> bool:
        return all(server.running for server in self.servers)

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start every server, then wait until each one's JetStream is healthy (the cluster
        elected its meta leader): before that, creating a bucket times out."""
        deadline = time.monotonic() + timeout_s
        for attempt in range(_PORT_ATTEMPTS):
            try:
                for server in self.servers:
                    server.start(timeout_s=max(1.0, deadline - time.monotonic()))
                for index in range(len(self.servers)):
                    self.wait_healthy(index, timeout_s=max(1.0, deadline - time.monotonic()))
                return
            except NATSServerError as exc:
                self.stop()
                # A port found free was taken by another process before the server bound it.
                if "address already in use" not in str(exc) or attempt == _PORT_ATTEMPTS - 1:
                    raise
                self._assign_ports()

    def healthy(self, index: int) -> bool:
        """nats-server's /healthz: the server is up and its JetStream current with the cluster."""
        url = f"http://127.0.0.1:{self.monitor_ports[index]}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, index: int, *, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy(index):
            if time.monotonic() > deadline:
                raise NATSServerError(f"nats-server n{index} not healthy within {timeout_s}s")
            time.sleep(0.1)

    def kill(self, index: int) -> None:
        """SIGKILL server `index`, as a crash would."""
        self.servers[index].kill()

    def restart(self, index: int, *, timeout_s: float = 30.0) -> None:
        """Start server `index` again on its ports and store; back when it is current."""
        self.servers[index].start(timeout_s=timeout_s)
        self.wait_healthy(index, timeout_s=timeout_s)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> NATSCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
