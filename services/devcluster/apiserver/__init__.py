"""A Kubernetes API server emulator (aiohttp) for integration tests and the demo.

Serves core, events.k8s.io and resource.k8s.io objects with kube-apiserver's REST
paths, validation, watch and error shapes; adds a request log and fault injection.
"""

from services.devcluster.apiserver.config import ClusterConfig
from services.devcluster.apiserver.errors import APIError
from services.devcluster.apiserver.faults import FaultRule
from services.devcluster.apiserver.server import APIServerEmulator

__all__ = ["APIError", "APIServerEmulator", "ClusterConfig", "FaultRule"]
