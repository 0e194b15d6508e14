"""The plugin's side of device plugin registration: `Register` on the kubelet's `kubelet.sock`.

Constants are the kubelet's (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go`). A
registration names the resource, the API version, our socket's file name within the device
plugin directory and our options. The kubelet answers with an error when the version is not
supported or another live plugin holds the resource name; the caller retries later.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from services.allocation.kubelet import sockets
from shared.errors import RecoverableError
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2 as dp
from shared.pb.kubelet.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

__all__ = [
    "DEVICE_PLUGIN_PATH",
    "KUBELET_SOCKET",
    "VERSION",
    "RegistrationError",
    "kubelet_identity",
    "register",
]

VERSION = "v1beta1"
DEVICE_PLUGIN_PATH = Path("/var/lib/kubelet/device-plugins/")
KUBELET_SOCKET = DEVICE_PLUGIN_PATH / "kubelet.sock"
_REGISTER_TIMEOUT_S = 5.0


class RegistrationError(RecoverableError):
    """The kubelet is not there or refused the registration; tried again later."""

    def __init__(self, message: str, *, resource: str) -> None:
        super().__init__(message)
        self.resource = resource


def kubelet_identity(kubelet_socket: Path) -> tuple[int, int] | None:
    """(inode, ctime) of kubelet.sock, None without one: a new value is a restarted kubelet."""
    try:
        stat = kubelet_socket.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_ctime_ns)


async def register(
    kubelet_socket: Path,
    *,
    resource: str,
    endpoint: str,
    options: dp.DevicePluginOptions,
    timeout_s: float = _REGISTER_TIMEOUT_S,
) -> None:
    """Register `resource` served on the socket file `endpoint`; RegistrationError if refused."""
    request = dp.RegisterRequest(
        version=VERSION, endpoint=endpoint, resource_name=resource, options=options
    )
    async with grpc.aio.insecure_channel(sockets.address(kubelet_socket)) as channel:
        try:
            await dp_grpc.RegistrationStub(channel).Register(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise RegistrationError(
                f"register {resource} at {kubelet_socket}: {exc.code().name}: {exc.details()}",
                resource=resource,
            ) from exc
