"""Create the compose stack's Node in the API emulator, as a kubelet would on a real node.

ResourceSlices are owned by their Node, so the discovery agent needs it to exist. Reads
the API server URL from $KUBECONFIG and the node name from $NODE_NAME; an existing Node
is fine (exit 0), so the service can run again.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import yaml

__all__ = ["main"]


def _server(kubeconfig: str) -> str:
    with open(kubeconfig, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster_name = context["context"]["cluster"]
    cluster = next(c for c in config["clusters"] if c["name"] == cluster_name)
    return str(cluster["cluster"]["server"]).rstrip("/")


def main() -> int:
    node = os.environ["NODE_NAME"]
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
    }
    request = urllib.request.Request(
        _server(os.environ["KUBECONFIG"]) + "/api/v1/nodes",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10):
            print(f"node {node} registered")
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            print(f"register node {node}: HTTP {exc.code}: {exc.read()!r}", file=sys.stderr)
            return 1
        print(f"node {node} already registered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
