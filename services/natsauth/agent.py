"""The auth service's wiring: its own NATS user, the kube client, and the callout responder.

Tasks: bus-connector, callout-responder (answers `$SYS.REQ.USER.AUTH`, opening sealed
requests and sealing answers when an xkey is configured, once the revocation list is read),
stream-provisioner (makes every stream of the app account through its own callout,
`provisioner`), revocation-watcher (`revoker`), with a SYS user sys-bus-connector (the
connection that kicks a revoked node's clients) and, with a certify key, writer-certifier (the
`certifier` connection that certifies the agents' writer keys), and quota-auditor (the
`auditor` connection that counts every node's keys and bytes in the buckets; a node over its
quota is revoked by `quotaenforcer`). The replicas subscribe in
one queue group, so each request goes to one of them: every connect is reviewed once, and a
second replica adds capacity. Each request is screened as it arrives (junk is settled there,
mostly unanswered); the others are answered concurrently (at most `MAX_IN_FLIGHT`): after a
NATS restart every agent reconnects at once, and one slow TokenReview must not hold the others
past nats-server's callout timeout. No decision logic lives here.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from nats.aio.msg import Msg

from services.natsauth import instruments, keys
from services.natsauth.apifetch import KubeFetch
from services.natsauth.authorizer import Authorizer, Decision
from services.natsauth.certifier import Certifier
from services.natsauth.config import AuthServiceConfig
from services.natsauth.identity import Policy
from services.natsauth.keyset import IssuerKeys
from services.natsauth.localcheck import LocalCheck
from services.natsauth.provisioner import Provisioner
from services.natsauth.quotaauditor import QuotaAuditor
from services.natsauth.quotaenforcer import QuotaEnforcer
from services.natsauth.quotaledger import Excess
from services.natsauth.ratelimit import SourceLimiter
from services.natsauth.reviewcache import ReviewCache
from services.natsauth.revocationstore import RevocationStore
from services.natsauth.revoker import Revoker
from services.natsauth.syskick import Kicker
from services.natsauth.tokenreview import KubeTokenReviewer, TokenReviewer
from shared import opsserver
from shared.bus.connection import Bus
from shared.errors import BusUnavailableError
from shared.kube.client import KubeClient
from shared.supervisor import eternal

__all__ = ["AUTH_QUEUE", "AUTH_SUBJECT", "AuthService"]

log = structlog.get_logger(__name__)
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
AUTH_QUEUE = "dra-nats-auth"
MAX_IN_FLIGHT = 64
_SERVER_XKEY_HEADER = "Nats-Server-Xkey"


class AuthService:
    """`shared.supervisor.Agent` for dra-nats-auth; `reviewer` replaces the kube TokenReview."""

    def __init__(self, config: AuthServiceConfig, *, reviewer: TokenReviewer | None = None):
        self.config = config
        self.ready = asyncio.Event()
        self.bus = Bus(config.nats, name="dra-nats-auth")
        self.provisioner = Provisioner(config.nats)
        sys_nats = config.sys_nats()
        self.sys_bus = Bus(sys_nats, name="dra-nats-auth-sys") if sys_nats is not None else None
        self.revoker: Revoker
        certify_key = config.certify_key()
        self.certifier = (
            Certifier(config.nats, signer=certify_key, lifetime_s=config.certificate_s)
            if certify_key is not None
            else None
        )
        self.auditor = QuotaAuditor(config.nats, exceeded=self._exceeded)
        self.enforcer: QuotaEnforcer
        self._reviewer = reviewer
        self._xkey = config.xkey()
        self.authorizer: Authorizer
        self.keys: IssuerKeys
        self.subscribed = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._in_flight: set[asyncio.Task[None]] = set()

    async def open(self, resources: contextlib.AsyncExitStack) -> None:
        kube = await KubeClient.connect(self.config.kube)
        resources.push_async_callback(kube.close)
        reviewer = self._reviewer or KubeTokenReviewer(kube)
        self.keys = IssuerKeys(KubeFetch(kube))
        # Closed in reverse: the bus drains (answers in flight still go out), then what is
        # left is cancelled, then the kube client closes under no review.
        resources.push_async_callback(self._cancel_in_flight)
        resources.push_async_callback(self.bus.close)
        if self.sys_bus is not None:
            resources.push_async_callback(self.sys_bus.close)
        config = self.config
        cache = ReviewCache(max_entries=config.review_cache_size, ttl_s=config.review_cache_s)
        store = RevocationStore(
            kube, namespace=config.agent_namespace, name=config.revocations_configmap
        )
        kicker = Kicker(self.sys_bus, account=config.target_account) if self.sys_bus else None
        self.revoker = Revoker(
            read=store.read, kick=kicker.end_node if kicker else None,
            forget=cache.drop_node, poll_s=config.revocation_poll_s,
        )  # fmt: skip
        self.enforcer = QuotaEnforcer(
            revoker=self.revoker, persist=lambda entry, now: store.revoke_once(entry, now=now)
        )
        resources.push_async_callback(self.enforcer.close)
        policy = Policy(
            agent_namespace=config.agent_namespace,
            operator_users=frozenset(config.operator_users),
            operator_groups=frozenset(config.operator_groups),
        )
        self.authorizer = Authorizer(
            reviewer=reviewer,
            policy=policy,
            local=LocalCheck(self.keys, audience=config.audience, policy=policy),
            cache=cache,
            revoked=self.revoker.revoked,
            limiter=SourceLimiter(rate_per_s=config.reviews_per_source, burst=config.review_burst),
            answered_refusals=SourceLimiter(
                rate_per_s=config.refusals_answered_per_s,
                burst=max(1.0, config.refusals_answered_per_s),
            ),
            max_session_s=config.max_session_s,
            drivers=config.driver_name,
            names=self.bus.names,
            account=config.target_account,
            audience=config.audience,
            issuer=config.issuer(),
            provisioner=self.provisioner.admits,
            certifier=self.certifier.admits if self.certifier is not None else lambda _: False,
            auditor=self.auditor.admits,
        )
        await opsserver.open_ops_server(
            config.ops, resources, ready=self.ready,
            readiness={"nats": self._subscribed, "streams": self._provisioned},
        )  # fmt: skip

    async def _subscribed(self) -> str | None:
        return None if self.subscribed.is_set() and self.bus.connected.is_set() else "no nats"

    async def _provisioned(self) -> str | None:
        return None if self.provisioner.done.is_set() else "streams not provisioned"

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        tasks = {
            "bus-connector": self.bus.run(),
            "revocation-watcher": self.revoker.run(),
            "callout-responder": self._respond_forever(),
            "stream-provisioner": self._provision_forever(),
            "quota-auditor": self._audit_forever(),
        }
        if self.sys_bus is not None:
            tasks["sys-bus-connector"] = self.sys_bus.run()
        if self.certifier is not None:
            tasks["writer-certifier"] = self._certify_forever(self.certifier)
        for name, coro in tasks.items():
            tg.create_task(eternal(name, coro), name=name)

    async def _respond_forever(self) -> None:
        await self.revoker.loaded.wait()  # not before it knows whom to refuse
        while True:
            await self.bus.connected.wait()
            try:
                # nats-py subscribes again by itself after a reconnect: once is enough.
                await self.bus.subscribe(AUTH_SUBJECT, self.handle, queue=AUTH_QUEUE)
            except BusUnavailableError:
                await asyncio.sleep(0.5)
                continue
            self.subscribed.set()
            log.info("nats_auth_serving", subject=AUTH_SUBJECT)
            await asyncio.Event().wait()

    async def _provision_forever(self) -> None:
        await self.subscribed.wait()  # its own connection goes through this callout
        await self.provisioner.run(self.bus)

    async def _audit_forever(self) -> None:
        await self.provisioner.done.wait()  # its connection goes through this callout, and
        await self.auditor.run()  # it reads the buckets as provisioned

    def _exceeded(self, excess: Excess) -> None:
        self.enforcer.exceeded(excess)

    async def _certify_forever(self, certifier: Certifier) -> None:
        await self.subscribed.wait()  # its own connection goes through this callout
        await certifier.run()

    async def handle(self, msg: Msg) -> None:
        """nats-py calls this once per request, in order. Junk is settled here, in memory and
        at once (`Authorizer.screen`), so it never waits for a slot ahead of a real token; the
        rest goes to a task of its own."""
        server_xkey = (msg.headers or {}).get(_SERVER_XKEY_HEADER, "")
        try:
            request = self._open(msg.data, server_xkey)
        except keys.SealError as exc:
            instruments.DECISIONS.add(1, {"outcome": "refused", "reason": "bad_request"})
            log.warning("nats_auth_request_unreadable", error=str(exc), security=True)
            return  # nothing we could answer that the server would trust
        screened = self.authorizer.screen(request)
        if screened is not None:
            await self._send(msg, screened, server_xkey)
            return
        await self._slots.acquire()
        task = asyncio.create_task(self.answer(msg, request, server_xkey), name="callout-request")
        self._in_flight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("nats_auth_request_failed", error=repr(exc))

    async def _cancel_in_flight(self) -> None:
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def answer(self, msg: Msg, request: str, server_xkey: str) -> None:
        await self._send(msg, await self.authorizer.authorize(request), server_xkey)

    async def _send(self, msg: Msg, decision: Decision, server_xkey: str) -> None:
        outcome = "allowed" if decision.allowed else "refused"
        instruments.DECISIONS.add(1, {"outcome": outcome, "reason": decision.reason,
                                      "role": decision.role})  # fmt: skip
        if decision.response:
            await msg.respond(self._seal(decision, server_xkey))

    def _open(self, data: bytes, server_xkey: str) -> str:
        if self._xkey is None:
            return data.decode("utf-8", errors="replace")
        if not server_xkey:
            raise keys.SealError("the server did not seal its request (is xkey in its config?)")
        return keys.open_sealed(data, key=self._xkey, sender=server_xkey).decode()

    def _seal(self, decision: Decision, server_xkey: str) -> bytes:
        body = decision.response.encode()
        if self._xkey is None:
            return body
        return keys.seal(body, key=self._xkey, recipient=server_xkey)
