"""Every NATS subject, KV bucket, KV key and stream name used by dra-suite, in one place.

Driver and node names are DNS subdomains, so their dots are mapped to `_` (never part of a
DNS name) to keep each name one subject token; the mapping is injective.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Names", "token"]


def token(name: str) -> str:
    """A DNS name as one subject token: `sim.dra-suite.io` -> `sim_dra-suite_io`."""
    return name.replace(".", "_")


@dataclass(frozen=True, slots=True)
class Names:
    """Names under an optional namespace prefix (tests give each suite its own)."""

    namespace: str = ""

    @property
    def _subject_prefix(self) -> str:
        return f"{self.namespace}." if self.namespace else ""

    @property
    def _bucket_prefix(self) -> str:
        return f"{self.namespace}_" if self.namespace else ""

    @property
    def inventory_bucket(self) -> str:
        return f"{self._bucket_prefix}dra_inventory"

    @property
    def health_bucket(self) -> str:
        return f"{self._bucket_prefix}dra_health"

    @property
    def alerts_stream(self) -> str:
        return f"{self._bucket_prefix}DRA_ALERTS".replace("-", "_")

    @property
    def alerts_wildcard(self) -> str:
        return f"{self._subject_prefix}dra.alerts.>"

    def alerts(self, driver: str, node: str) -> str:
        return f"{self._subject_prefix}dra.alerts.{token(driver)}.{token(node)}"

    def fault_control(self, driver: str, node: str) -> str:
        """Request/reply subject for injecting faults into sim devices."""
        return f"{self._subject_prefix}dra.control.{token(driver)}.{token(node)}.fault"

    def drain_control(self, driver: str, node: str) -> str:
        """Request/reply subject for draining and undraining devices by hand (dractl)."""
        return f"{self._subject_prefix}dra.control.{token(driver)}.{token(node)}.drain"

    @staticmethod
    def inventory_key(driver: str, node: str) -> str:
        return f"{token(driver)}.{token(node)}"

    @staticmethod
    def health_key(driver: str, node: str, device: str) -> str:
        return f"{token(driver)}.{token(node)}.{device}"

    @staticmethod
    def health_keys(driver: str, node: str) -> str:
        """KV watch filter for all device health keys of one node."""
        return f"{token(driver)}.{token(node)}.*"
