"""The emulated cluster's state in one place: config, registry, store, verbs, request log, faults.

Shared by the HTTP layer and `APIServerEmulator`'s in-process API. No I/O.
"""

from __future__ import annotations

from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.faults import Faults
from devcluster.apiserver.operations import Operations
from devcluster.apiserver.registry import Registry
from devcluster.apiserver.requestlog import RequestLog
from devcluster.apiserver.store import Store
from devcluster.apiserver.tokensigner import TokenIssuer

__all__ = ["Cluster"]


class Cluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.registry = Registry(config)
        self.store = Store(history=config.watch_history)
        self.operations = Operations(config, self.store)
        self.request_log = RequestLog(maxlen=config.request_log_size)
        self.faults = Faults()
        self.tokens = TokenIssuer()
        """Signs and reviews ServiceAccount tokens (TokenRequest, TokenReview)."""
        self.namespaced_paths = frozenset(
            (t.group, t.version, t.plural) for t in self.registry.types if t.namespaced
        )
        self.server_address = "127.0.0.1:0"
        """host:port once the HTTP server listens (shown in /api discovery)."""
