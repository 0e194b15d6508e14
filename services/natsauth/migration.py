"""Rolling from the open bus to the callout-secured one: JetStream data changes account.

An open nats-server keeps every stream (the KV buckets, the alert stream) in the global
account, on disk under `<store>/jetstream/$G`. With config-mode accounts the agents live in
account `DRA`, which would start empty. `adopt_global_account` renames the global account's
directory to the app account's while the server is stopped (an init container of the NATS
pod), so the buckets and alerts carry over unchanged. Idempotent; it refuses to merge.
"""

from __future__ import annotations

from pathlib import Path

from shared.errors import ConfigError

__all__ = ["GLOBAL_ACCOUNT", "adopt_global_account"]

GLOBAL_ACCOUNT = "$G"


def adopt_global_account(store_dir: Path, *, account: str) -> bool:
    """Give the global account's JetStream data to `account`; True when something moved.

    Run only while nats-server is stopped. Raises ConfigError when both accounts hold data
    (a merge would need the streams' contents compared; an operator decides).
    """
    root = store_dir / "jetstream"
    source, target = root / GLOBAL_ACCOUNT, root / account
    if not source.is_dir():
        return False
    if target.exists():
        if any(target.iterdir()):
            raise ConfigError(
                f"jetstream store {root}: both {GLOBAL_ACCOUNT} and {account} hold data; "
                "move or remove one by hand",
                field="store_dir",
            )
        target.rmdir()
    source.rename(target)
    return True
