"""The dra-suite error tree, grouped by how each error is handled.

    DraSuiteError
    ├── RecoverableError          retried with bounded, jittered backoff; the agent keeps serving
    │   ├── BusUnavailableError   NATS down or timing out
    │   ├── KubeTransientError    429, 5xx, timeouts, cut connections
    │   ├── KubeConflictError     409 on update/delete: re-read and retry
    │   ├── KubeExpiredError      410 Gone on a watch: relist
    │   └── BackendUnavailableError  a device backend failed a scan; keep the last inventory
    ├── KubeError                 a definite API answer that retrying will not change
    │   ├── KubeNotFoundError     404
    │   ├── KubeAlreadyExistsError  409 AlreadyExists on create
    │   └── KubeInvalidError      422 / 400: the object was rejected
    ├── ClaimError                belongs to one claim: goes into its NodePrepare/Unprepare response
    │   ├── ClaimNotFoundError, ClaimUIDMismatchError, ClaimNotAllocatedError
    │   ├── DeviceNotAllocatableError, InvalidOpaqueConfigError
    │   └── CheckpointWriteError  the claim's checkpoint could not be written (disk full, read-only)
    ├── MalformedMessageError     a bus message that does not decode: logged and dropped
    ├── ReplyRefusedError         a control reply not signed by the node's health agent
    ├── FatalError                unwinds the agent's TaskGroup: exit 1, Kubernetes restarts the pod
    │   ├── ConfigError (exit 2, raised before any connection opens)
    │   ├── CheckpointCorruptError, SocketBindError, BackendLoadError
    └── ProgrammingError          a bug in our code (broken invariant); never caught on purpose

Adapters convert third-party exceptions at the boundary (`raise X(...) from exc`), so
`ApiException`, `nats.errors.*` and `grpc.RpcError` never escape shared/kube, shared/bus or
the gRPC servicers. Context is carried in attributes as well as in the message.
"""

from __future__ import annotations

__all__ = [
    "BackendLoadError",
    "BackendUnavailableError",
    "BusUnavailableError",
    "CheckpointCorruptError",
    "CheckpointWriteError",
    "ClaimError",
    "ClaimNotAllocatedError",
    "ClaimNotFoundError",
    "ClaimUIDMismatchError",
    "ConfigError",
    "DeviceNotAllocatableError",
    "DraSuiteError",
    "FatalError",
    "InvalidOpaqueConfigError",
    "KubeAlreadyExistsError",
    "KubeConflictError",
    "KubeError",
    "KubeExpiredError",
    "KubeInvalidError",
    "KubeNotFoundError",
    "KubeTransientError",
    "MalformedMessageError",
    "ProgrammingError",
    "RecoverableError",
    "ReplyRefusedError",
    "SocketBindError",
]


class DraSuiteError(Exception):
    """Root of every error raised on purpose by dra-suite."""


class RecoverableError(DraSuiteError):
    """Retried inside the task with bounded, jittered backoff."""


class BusUnavailableError(RecoverableError):
    def __init__(self, message: str, *, subject: str = "") -> None:
        super().__init__(message)
        self.subject = subject


class KubeTransientError(RecoverableError):
    def __init__(
        self, message: str, *, status: int = 0, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class KubeConflictError(RecoverableError):
    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class KubeExpiredError(RecoverableError):
    """The watch's resourceVersion is too old (410 Gone): relist, then watch again."""


class BackendUnavailableError(RecoverableError):
    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message)
        self.backend = backend


class KubeError(DraSuiteError):
    """A definite answer from the API server that a retry will not change."""

    def __init__(self, message: str, *, status: int, reason: str = "", name: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.name = name


class KubeNotFoundError(KubeError):
    pass


class KubeAlreadyExistsError(KubeError):
    pass


class KubeInvalidError(KubeError):
    pass


class ClaimError(DraSuiteError):
    """A failure of one claim; reported in that claim's response entry only."""

    def __init__(self, message: str, *, claim_uid: str) -> None:
        super().__init__(message)
        self.claim_uid = claim_uid


class ClaimNotFoundError(ClaimError):
    pass


class ClaimUIDMismatchError(ClaimError):
    pass


class ClaimNotAllocatedError(ClaimError):
    pass


class DeviceNotAllocatableError(ClaimError):
    def __init__(self, message: str, *, claim_uid: str, device: str) -> None:
        super().__init__(message, claim_uid=claim_uid)
        self.device = device


class InvalidOpaqueConfigError(ClaimError):
    def __init__(self, message: str, *, claim_uid: str, field: str = "") -> None:
        super().__init__(message, claim_uid=claim_uid)
        self.field = field


class CheckpointWriteError(ClaimError):
    pass


class MalformedMessageError(DraSuiteError):
    """A message on the bus that does not decode; the reader logs it and goes on."""

    def __init__(self, message: str, *, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class ReplyRefusedError(DraSuiteError):
    """A reply on the bus whose writer is not the one the request's subject names (signatures
    on); the requester takes no answer from it."""

    def __init__(self, message: str, *, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class FatalError(DraSuiteError):
    """Unwinds the agent; the process exits and Kubernetes restarts it."""


class ConfigError(FatalError):
    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class CheckpointCorruptError(FatalError):
    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class SocketBindError(FatalError):
    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class BackendLoadError(FatalError):
    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message)
        self.backend = backend


class ProgrammingError(DraSuiteError):
    """A broken invariant in our own code."""
