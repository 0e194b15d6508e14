"""Writing a kubeconfig that points kubernetes-asyncio (or kubectl) at the emulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["kubeconfig", "write"]

_NAME = "devcluster"


def kubeconfig(
    server_url: str, *, token: str | None = None, ca_file: str | None = None
) -> dict[str, Any]:
    user: dict[str, Any] = {"token": token} if token else {}
    cluster: dict[str, Any] = {"server": server_url}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": _NAME, "cluster": cluster}],
        "users": [{"name": _NAME, "user": user}],
        "contexts": [{"name": _NAME, "context": {"cluster": _NAME, "user": _NAME}}],
        "current-context": _NAME,
        "preferences": {},
    }


def write(
    path: str | Path, server_url: str, *, token: str | None = None, ca_file: str | None = None
) -> Path:
    """Write atomically (temp file + rename) so a reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    document = kubeconfig(server_url, token=token, ca_file=ca_file)
    tmp.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp.replace(target)
    return target
