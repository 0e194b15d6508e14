"""The OpenTelemetry resource of an agent: who emits a span or a metric series.

Traces and metrics share it, so a span and the `target_info` series of the same agent carry the
same service, version, node and driver. The standard `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` override what the agent sets, as the SDK documents.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource

__all__ = ["DRIVER_ATTRIBUTE", "NODE_ATTRIBUTE", "agent_resource", "build_version"]

NODE_ATTRIBUTE = "k8s.node.name"
"""The OpenTelemetry semantic-convention name of the Kubernetes node."""
DRIVER_ATTRIBUTE = "dra.driver.name"
"""The DRA driver the agent serves (`sim.dra-suite.io`, `gpu.dra-suite.io`, ...)."""


def build_version() -> str:
    """The installed dra-suite version, or `unknown` when run from an uninstalled tree."""
    try:
        return importlib.metadata.version("dra-suite")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def agent_resource(
    *, service: str, node: str = "", driver: str = "", environ: Mapping[str, str]
) -> Resource:
    """The resource of `service` on `node` serving `driver`; empty values are left out.

    `environ` is the process environment, read for the two standard override variables.
    """
    attributes: dict[str, str] = {
        "service.name": service,
        "service.namespace": "dra-suite",
        "service.version": build_version(),
    }
    if node:
        attributes[NODE_ATTRIBUTE] = node
    if driver:
        attributes[DRIVER_ATTRIBUTE] = driver
    # Explicit attributes win over the SDK's own environment detection in Resource.create, but
    # the standard variables are the user's override, so they are applied last.
    attributes.update(_from_environment(environ))
    return Resource.create(attributes)


def _from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, percent-encoded), then `OTEL_SERVICE_NAME`."""
    found: dict[str, str] = {}
    for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            found[key.strip()] = unquote(value.strip())
    service = environ.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        found["service.name"] = service
    return found
