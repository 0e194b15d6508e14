"""A Kubernetes API server emulator (aiohttp) for integration tests and the demo.

Serves core, events.k8s.io and resource.k8s.io objects with kube-apiserver's REST
paths, validation, watch and error shapes; adds a request log and fault injection.
"""

from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.errors import APIError
from devcluster.apiserver.faults import FaultRule
from devcluster.apiserver.server import APIServerEmulator

__all__ = ["APIError", "APIServerEmulator", "ClusterConfig", "FaultRule"]
