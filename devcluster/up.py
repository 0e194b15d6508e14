"""`devcluster up`: the local stack until a stop signal, with every endpoint printed.

Besides the stack it registers the plugin with a kubelet emulator (so the allocation agent's
/readyz turns ready) and creates a DeviceClass for every device of the driver, so that
`devcluster claim` can prepare a claim right away. It records the endpoints in the work dir
for that helper. The bus is open (no auth, no TLS) and listens on 127.0.0.1 only. The commands
it suggests are printed as paths that run as they are (`.venv/bin/dractl`): a venv's scripts
are on PATH only once it is activated.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from devcluster import flow, workdir
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import AGENTS, OPEN_BUS_WARNING, LocalStack, StackConfig

__all__ = ["StoppedError", "command_path", "run_up"]

_T = TypeVar("_T")


class StoppedError(Exception):
    """A stop signal arrived before the step it interrupted finished."""


async def run_up(config: StackConfig, *, stop: asyncio.Event, out: TextIO) -> int:
    """Run the stack until `stop` is set; 0 when every agent then exited 0."""
    stack = LocalStack(config)
    kubelet = KubeletEmulator(config.registry_dir)
    try:
        try:
            await _unless_stopped(_start(stack, kubelet), stop)
        except StoppedError:
            out.write("stopped before the stack was up\n")
        else:
            _print_endpoints(stack.endpoints(), config=config, out=out)
            async with _pods_prepared(stack, kubelet):
                await stop.wait()
        out.write("stopping: the agents first, then the API emulator and nats-server\n")
        out.flush()
    finally:
        await kubelet.close()
        codes = await stack.stop()
    out.write(", ".join(f"{agent} exited {code}" for agent, code in codes.items()) + "\n")
    out.flush()
    return 0 if all(code == 0 for code in codes.values()) else 1


async def _start(stack: LocalStack, kubelet: KubeletEmulator) -> None:
    cfg = stack.config
    await stack.start()
    async with stack.kube() as kube:
        await flow.create_device_class(
            kube, name=cfg.driver_name, cel=f'device.driver == "{cfg.driver_name}"'
        )
    await kubelet.register(driver=cfg.driver_name, timeout_s=30.0)
    await stack.wait_agents_ready()
    workdir.write_endpoints(cfg.workdir, stack.endpoints())


@contextlib.asynccontextmanager
async def _pods_prepared(stack: LocalStack, kubelet: KubeletEmulator) -> AsyncIterator[None]:
    """On the real control plane, the kubelet's DRA part: pods kube-scheduler binds to the node
    get their claims prepared (and unprepared when deleted) through the kubelet emulator."""
    if stack.real is None:
        yield
        return
    cfg = stack.config
    async with (
        stack.kube() as kube,
        KubeletShim(kube, kubelet, node=cfg.node_name, driver=cfg.driver_name),
    ):
        yield


async def _unless_stopped(step: Awaitable[_T], stop: asyncio.Event) -> _T:
    """Await `step`, or cancel it and raise StoppedError when `stop` is set first."""
    task = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise StoppedError


def _print_endpoints(endpoints: dict[str, Any], *, config: StackConfig, out: TextIO) -> None:
    url, node = endpoints["nats_url"], endpoints["node"]
    rows = [
        ("NATS", f"{url}  (open bus: no auth, no TLS; 127.0.0.1 only)"),
        (_api_label(endpoints), endpoints["api_url"]),
        ("kubeconfig", endpoints["kubeconfig"]),
        ("CDI specs", endpoints["cdi_dir"]),
        ("plugin registry", endpoints["plugin_registry_dir"]),
        ("logs", endpoints["logs_dir"]),
    ]
    rows += [
        (f"{agent} ops", f"{endpoints['ops'][agent]}/metrics  /healthz  /readyz")
        for agent in AGENTS
    ]
    out.write(f"{OPEN_BUS_WARNING}\n")
    out.write(f"dra-suite is up: driver {endpoints['driver']}, node {node}\n")
    for name, value in rows:
        out.write(f"  {name:<16} {value}\n")
    dractl, dra_suite = command_path("dractl"), f"{command_path('python')} -m devcluster"
    out.write(
        "try:\n"
        f"  export NATS_URL={url} NODE_NAME={node}\n"
        f"  {dractl} inventory\n"
        f"  {dractl} health\n"
        f"  {dractl} claims\n"
        f"  {dra_suite} claim --workdir {config.workdir}   # a prepare via the kubelet emulator\n"
        f"  {dra_suite} load --workdir {config.workdir}    # a steady load, for the metrics\n"
        "Ctrl-C (or SIGTERM/SIGHUP) stops everything\n"
    )
    out.flush()


def command_path(name: str, *, cwd: Path | None = None) -> str:
    """How to run console script `name` from `cwd`: the script next to this interpreter (in
    the venv), relative to `cwd` when below it; the bare name when there is no such file."""
    script = Path(sys.executable).parent / name
    if not script.is_file():
        return name
    here = (cwd or Path.cwd()).resolve()
    # Not resolved: the venv's python is a symlink out of the venv.
    absolute = script.absolute()
    try:
        return str(absolute.relative_to(here))
    except ValueError:
        return str(absolute)


def _api_label(endpoints: dict[str, Any]) -> str:
    return "kube-apiserver" if endpoints.get("control_plane") == "real" else "API emulator"
