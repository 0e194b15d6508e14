"""Device backends: `load_backend` opens the one the node's `--backend` names.

The seam (`DeviceBackend`, `Scan`) is `shared.vendors.parts.discovery`; each backend is its
vendor package's, reached through `shared.vendors.registry`.
"""

from __future__ import annotations

from services.discovery.config import DiscoveryConfig
from shared.errors import BackendLoadError
from shared.vendors import registry
from shared.vendors.parts.discovery import BackendSeams, DeviceBackend

__all__ = ["load_backend"]


def load_backend(config: DiscoveryConfig, *, seams: BackendSeams | None = None) -> DeviceBackend:
    """The backend named by `config.backend`; BackendLoadError when it cannot be used."""
    vendor = registry.BACKENDS.get(config.backend)
    if vendor is None:
        raise BackendLoadError(f"unknown backend {config.backend}", backend=config.backend)
    return vendor.load_backend(config, seams or BackendSeams())
