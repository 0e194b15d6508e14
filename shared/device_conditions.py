"""The conditions the allocation agent publishes per prepared device in a claim's
`status.devices` (KEP-4817), and how a health verdict becomes one (pure).

`Ready` says the device is prepared on its node; `Healthy` follows the health agent's verdict
for the device (True, False, or Unknown without a record). `dractl claims` derives the same
conditions from the same records, so what it shows is what the claim says.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEALTHY", "READY", "Condition", "healthy", "ready"]

READY = "Ready"
HEALTHY = "Healthy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """A metav1.Condition without its times (they come from whoever writes it)."""

    type: str
    status: str
    """True, False or Unknown."""
    reason: str
    """CamelCase, as metav1.Condition requires."""
    message: str = ""


def ready(node: str) -> Condition:
    return Condition(type=READY, status="True", reason="Prepared", message=f"prepared on {node}")


def healthy(health: str, message: str = "") -> Condition:
    """From a health verdict: `Healthy`, `Unhealthy` or anything else (unknown)."""
    if health == "Healthy":
        return Condition(type=HEALTHY, status="True", reason="DeviceHealthy", message=message)
    if health == "Unhealthy":
        return Condition(type=HEALTHY, status="False", reason="DeviceUnhealthy", message=message)
    return Condition(
        type=HEALTHY,
        status="Unknown",
        reason="HealthUnknown",
        message=message or "no verdict from the health agent yet",
    )
