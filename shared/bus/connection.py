"""One NATS connection per agent: connects in the background, reconnects forever.

The agent never blocks its start on NATS: `run()` is an eternal task that retries the first
connection with backoff, after which nats-py reconnects by itself. Every operation raises
`BusUnavailableError` while disconnected, so callers keep serving from what they last saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import nats
import nats.errors
import nats.js.errors
import nkeys  # type: ignore[import-untyped]  # ships no type hints
import structlog
from nats.aio.client import Client as NATSClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from shared import metrics, nats_auth, telemetry
from shared.backoff import Backoff
from shared.bus import convergence, origin, records, signing, streams
from shared.bus.client import ClosingClient
from shared.bus.connect_watch import ConnectProgress, ConnectStalledError
from shared.bus.kventry import change_of, stored_headers
from shared.bus.subjects import Names
from shared.cancellation import reraise_if_cancelling
from shared.config import NATSSettings
from shared.errors import BusUnavailableError, ConfigError, ReplyRefusedError
from shared.redaction import redact_url

__all__ = ["Bus", "ControlHandler", "ControlRequest", "MessageHandler", "Request"]

log = structlog.get_logger(__name__)
_reconnects = metrics.meter(__name__).create_counter(
    "dra_nats_reconnects", unit="1", description="NATS reconnections after a lost connection."
)
metrics.export_at_zero(_reconnects)

MessageHandler = Callable[[Msg], Awaitable[None]]
_REPEAT_LOG_INTERVAL_S = 30.0
# Draining takes milliseconds; past this the server is gone (see _drain_or_close).
_DRAIN_TIMEOUT_S = 3.0
# How long a given-up connect attempt and its close may take before they are cut short.
_ABANDON_WAIT_S = 1.0
_DIRECT_GET_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8)
# A server that is gone closes its sockets; pings find only a silent one (a frozen process, a
# partition), after interval x outstanding = 60 s. Each ping is a TLS write and read at both
# ends: 5,000 nodes with three connections each send 750 a second at this interval.
_PING_INTERVAL_S = 20
_MAX_OUTSTANDING_PINGS = 3

# Errors that mean "NATS is not reachable right now" rather than a bad request.
_UNAVAILABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    # A stream whose leader just died (a cluster electing another) answers nothing for a while.
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServerError,
    TimeoutError,
    OSError,
)


def _classify(exc: Exception) -> tuple[str, str]:
    """The log event for a connection error, and its message without URL userinfo."""
    error = redact_url(str(exc)) or type(exc).__name__
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in (
        error.lower()
    ):
        return "nats_auth_rejected", error
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "nats_tls_failed", error
    if isinstance(exc, nats_auth.CredentialsUnreadableError):
        return "nats_credentials_unreadable", error
    return "nats_error", error


async def _drain_or_close(nc: NATSClient, *, timeout_s: float) -> None:
    """Drain; past `timeout_s` close instead. A server that goes away mid-drain leaves
    nats-py waiting 10 s for a PONG that never comes, and the agent would miss its deadline.
    A flush first finds a server that is already gone without starting the drain, whose
    cancellation nats-py would report as an exception never retrieved."""
    await nc.flush(timeout=1)
    drain = asyncio.ensure_future(nc.drain())
    try:
        done, _ = await asyncio.wait({drain}, timeout=timeout_s)
    finally:
        if not drain.done():
            log.warning("nats_drain_timed_out", timeout_s=timeout_s)
            await nc.close()
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_UNAVAILABLE):
                await drain
    if drain in done:
        drain.result()


class _RepeatGate:
    """One log line per distinct error, the same one again only after `interval_s`.

    nats-py retries a refused connection four times a second, often alternating two errors
    (the rejection, then the closed socket); without the gate a wrong password would write
    several error lines a second for as long as it stays wrong.
    """

    _MAX_KEYS = 64

    def __init__(self, *, interval_s: float) -> None:
        self.interval_s = interval_s
        self._seen: dict[str, tuple[float, int]] = {}  # error -> (last logged at, dropped since)

    def admit(self, key: str) -> int | None:
        """None to drop the line, else how many identical lines were dropped before it."""
        now = time.monotonic()
        logged_at, dropped = self._seen.get(key, (None, 0))
        if logged_at is not None and now - logged_at < self.interval_s:
            self._seen[key] = (logged_at, dropped + 1)
            return None
        if len(self._seen) >= self._MAX_KEYS:
            self._seen.clear()
        self._seen[key] = (now, 0)
        return dropped

    def reset(self) -> None:
        self._seen.clear()


class Request(Protocol):
    """What `Bus.reply` needs of a request: where it was sent and where to answer."""

    @property
    def subject(self) -> str: ...

    @property
    def reply(self) -> str: ...


class ControlRequest:
    """A request on a control subject, as `Bus.serve` hands it over: `respond` signs."""

    def __init__(self, bus: Bus, msg: Msg) -> None:
        self._bus = bus
        self._msg = msg

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def reply(self) -> str:
        return self._msg.reply

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self._msg.headers

    async def respond(self, data: bytes) -> None:
        await self._bus.reply(self._msg, data)


ControlHandler = Callable[[ControlRequest], Awaitable[None]]


class Bus:
    """The agent's NATS connection, JetStream context and idempotently created resources."""

    def __init__(
        self, settings: NATSSettings, *, name: str, component: str = "", node: str = ""
    ) -> None:
        """`component` (discovery, allocation, health, operator) and `node` pick this Bus's
        inbox prefix, the one its bus identity alone may subscribe to; empty: nats-py's."""
        self.settings = settings
        self.names = Names(settings.namespace)
        self.name = name
        self.inbox_prefix = self.names.inbox_prefix(component, node) if component else ""
        self.component = component
        self.node = node
        self.marker_ttl_s = streams.MARKER_TTL_S
        self.reconnects = 0
        self.connected = asyncio.Event()
        # Incremented on every (re)connect; watchers compare it to know they must resubscribe.
        self.epoch = 0
        self._epoch_changed = asyncio.Condition()
        self._nc: NATSClient | None = None
        self._js: JetStreamContext | None = None
        self._buckets: dict[str, KeyValue] = {}
        # Streams whose differing settings were logged (or an update refused): once a process.
        self._drift_reported: set[str] = set()
        self._closing = False
        # Set when nats-py closed the connection on its own (not by `close()`).
        self._lost = asyncio.Event()
        self._error_gate = _RepeatGate(interval_s=_REPEAT_LOG_INTERVAL_S)
        # Signed records (`--bus-signatures`): this process's writer key and the readers' check.
        self.records = records.Records(settings, names=self.names, role=component, node=node)
        self._certifying = asyncio.Lock()
        self._connect_progress = ConnectProgress(connect_timeout_s=settings.connect_timeout_s)

    async def run(self) -> None:
        """Eternal task: connect (retrying forever), then keep the connection's epoch current.

        nats-py reconnects by itself after a lost socket, but it *closes* the connection for
        good on some server errors, e.g. `User Authentication Expired` when the user JWT an
        auth callout issued runs out with the token it was issued for. Such a close starts
        the whole connect again, which reads the (rotated) credentials anew.
        """
        metrics.observe_nats_connection(self.connected.is_set)
        log.info(
            "nats_connecting",
            servers=redact_url(self.settings.url),
            auth=nats_auth.auth_method(self.settings),
        )
        first = True
        while True:
            nc = await self._connect_with_backoff()
            reraise_if_cancelling()
            self._lost.clear()
            self._nc = nc
            self._js = nc.jetstream(timeout=self.settings.request_timeout_s)
            if not first:
                self.reconnects += 1
                _reconnects.add(1)
            await self._on_connected(first=first)
            first = False
            await self._lost.wait()
            log.warning("nats_connecting_again", reason="connection closed by the client library")

    async def _connect_with_backoff(self) -> NATSClient:
        backoff = Backoff(initial_s=0.1, max_s=5.0)
        while True:
            try:
                return await self._connect_once()
            except (
                *_UNAVAILABLE,
                ConnectStalledError,
                ConfigError,
                nats_auth.CredentialsUnreadableError,
                nkeys.NkeysError,
            ) as exc:
                # A secret file that went bad since start (ConfigError) is retried as well:
                # a fixed Secret must not need a restart.
                reraise_if_cancelling()
                delay = backoff.next_delay()
                log.warning(
                    "nats_connect_failed",
                    error=redact_url(str(exc)) or type(exc).__name__,
                    retry_in_s=round(delay, 2),
                )
                await asyncio.sleep(delay)

    async def _connect_once(self) -> NATSClient:
        servers = [url.strip() for url in self.settings.url.split(",") if url.strip()]
        options = nats_auth.connect_options(self.settings)
        if self.inbox_prefix:
            options["inbox_prefix"] = self.inbox_prefix
        # nats-py types these as int and takes floats (its own `nats.connect` is untyped).
        options |= {"reconnect_time_wait": 0.25, "connect_timeout": self.settings.connect_timeout_s}
        nc = ClosingClient()
        attempt = asyncio.ensure_future(
            nc.connect(
                servers,
                name=self.name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                ping_interval=_PING_INTERVAL_S,
                max_outstanding_pings=_MAX_OUTSTANDING_PINGS,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                error_cb=self._on_error,
                closed_cb=functools.partial(self._on_closed, nc),
                **options,
            )
        )
        try:
            # Awaited through `wait`, so a stop reaches this task at once: inside nats-py a
            # cancel that races a completed read is dropped by Python 3.11's `wait_for`, and
            # the connect would go on to wait out its timeout.
            await self._connect_progress.wait(attempt)
            attempt.result()
        except BaseException:
            # nats-py leaves the attempt's socket open when it is cancelled or its error
            # callback re-raises a pending stop: close it here, whatever happened.
            attempt.cancel()
            closing = asyncio.ensure_future(nc.close())
            await asyncio.wait({attempt, closing}, timeout=_ABANDON_WAIT_S)
            for task in (attempt, closing):
                if not task.done():
                    task.cancel()  # a TLS close can wait for a peer that never answers
                elif not task.cancelled():
                    task.exception()  # retrieved here; what failed the connect is raised
            nc.abort_socket()
            raise
        return nc

    async def _on_connected(self, *, first: bool) -> None:
        self._buckets.clear()
        self._error_gate.reset()
        self.connected.set()
        async with self._epoch_changed:
            self.epoch += 1
            self._epoch_changed.notify_all()
        log.info("nats_connected", first=first, epoch=self.epoch, reconnects=self.reconnects)

    async def _on_disconnected(self) -> None:
        self.connected.clear()
        if not self._closing:
            log.warning("nats_disconnected")

    async def _on_reconnected(self) -> None:
        self.reconnects += 1
        _reconnects.add(1)
        await self._on_connected(first=False)

    async def _on_error(self, exc: Exception) -> None:
        # nats-py's first-connect loop runs in our task and calls this after every failed
        # attempt: the place to notice a stop whose cancellation its wait_for swallowed
        # (refused credentials keep that loop spinning, and the agent would never stop).
        reraise_if_cancelling()
        self._connect_progress.mark()
        event, error = _classify(exc)
        repeated = self._error_gate.admit(error)
        if repeated is None:
            return
        # Rejected credentials or certificates do not heal by themselves: error, not warning.
        emit = log.warning if event == "nats_error" else log.error
        emit(event, error=error, auth=nats_auth.auth_method(self.settings), repeated=repeated)

    async def _on_closed(self, nc: NATSClient) -> None:
        if nc is not self._nc:
            return  # an attempt given up inside `_connect_once`, never the live connection
        self.connected.clear()
        if not self._closing:
            log.warning("nats_closed")
            self._lost.set()

    async def wait_epoch_after(self, epoch: int) -> int:
        """Wait until the connection epoch moves past `epoch` (a reconnect happened)."""
        async with self._epoch_changed:
            await self._epoch_changed.wait_for(lambda: self.epoch > epoch)
            return self.epoch

    async def close(self) -> None:
        """Drain (flush what is in flight), then close."""
        nc, self._nc = self._nc, None
        self._closing = True
        self.connected.clear()
        if nc is None or nc.is_closed:
            return
        try:
            if nc.is_connected:
                await _drain_or_close(nc, timeout_s=_DRAIN_TIMEOUT_S)
            else:
                await nc.close()
        except _UNAVAILABLE as exc:
            log.warning("nats_drain_failed", error=str(exc) or type(exc).__name__)
            await nc.close()

    @property
    def js(self) -> JetStreamContext:
        if self._js is None or not self.connected.is_set():
            raise BusUnavailableError("nats is not connected")
        return self._js

    @property
    def nc(self) -> NATSClient:
        if self._nc is None or not self.connected.is_set():
            raise BusUnavailableError("nats is not connected")
        return self._nc

    async def kv(self, bucket: str) -> KeyValue:
        """The bucket, once it is as its provisioner makes it (`convergence.ensure`: on the open
        bus the first client creates it). A bucket whose owned settings differ raises
        `StreamTamperedError`: the agent exits rather than trust it."""
        if (cached := self._buckets.get(bucket)) is not None:
            return cached
        js = self.js
        stream = self.names.kv_stream(bucket)
        await convergence.ensure(
            self.nc, streams.kv_stream(bucket, replicas=self.settings.replicas),
            timeout_s=self.settings.request_timeout_s, reported=self._drift_reported,
            bucket=bucket,
        )  # fmt: skip
        kv = KeyValue(name=bucket, stream=stream, pre=f"$KV.{bucket}.", js=js, direct=True)
        self._buckets[bucket] = kv
        return kv

    async def ensure_stream(
        self, *, name: str, subjects: list[str], max_age_s: float, duplicate_window_s: float
    ) -> None:
        """The alert stream, once it is as its provisioner makes it; its retention
        (`max_age_s`, `duplicate_window_s`) is this agent's wish, not a condition."""
        wanted = streams.alerts_stream(
            name, subjects, replicas=self.settings.replicas, max_age_s=max_age_s,
            duplicate_window_s=duplicate_window_s,
        )  # fmt: skip
        await convergence.ensure(
            self.nc, wanted, timeout_s=self.settings.request_timeout_s,
            reported=self._drift_reported,
            tunable=(*streams.TUNABLE, "max_age", "duplicate_window"),
        )  # fmt: skip

    async def kv_put(self, bucket: str, key: str, value: bytes) -> int:
        """Put `value` at `key`; the current trace context travels in the entry's headers
        (a KV put is a JetStream publish to the key's subject), so watchers continue it."""
        if not _valid_key(key):
            raise nats.js.errors.InvalidKeyError(key)
        await self.kv(bucket)
        subject = self.names.kv_subject(bucket, key)
        headers = await self._signed(subject, value, telemetry.inject({}))
        try:
            ack = await self.js.publish(subject, value, headers=headers or None)
            return int(ack.seq)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"kv put {bucket}/{key}: {exc}", subject=key) from exc

    async def kv_get(self, bucket: str, key: str) -> bytes | None:
        """The key's value. A direct get that nobody answers (on a cluster, no replica of a
        bucket just made or just failed over is serving yet) is tried again for a moment.
        With signatures on, a value its owner did not sign is no value (None, logged)."""
        kv = await self.kv(bucket)
        for pause_s in (*_DIRECT_GET_PAUSES_S, None):
            try:
                if self.records.on:
                    return await self.checked_get(bucket, key)
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return None
            except nats.errors.NoRespondersError as exc:
                if pause_s is None:
                    raise BusUnavailableError(f"kv get {bucket}/{key}: {exc}", subject=key) from exc
                await asyncio.sleep(pause_s)
            except _UNAVAILABLE as exc:
                raise BusUnavailableError(f"kv get {bucket}/{key}: {exc}", subject=key) from exc
            else:
                return entry.value
        raise AssertionError("unreachable: the last pause is None")

    async def kv_delete(self, bucket: str, key: str) -> None:
        """Put the key's delete marker, which expires after `marker_ttl_s`."""
        await self.kv(bucket)
        subject = self.names.kv_subject(bucket, key)
        marker = telemetry.inject({KV_OP: KV_DEL, "Nats-TTL": f"{self.marker_ttl_s}s"})
        headers = await self._signed(subject, b"", marker)
        try:
            await self.js.publish(subject, b"", headers=headers)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"kv delete {bucket}/{key}: {exc}", subject=key) from exc

    async def publish_js(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Publish to a stream and wait for the ack; `msg_id` deduplicates within the window
        (with signatures on, as an ID only this process can compute: `Records.msg_id`)."""
        all_headers = telemetry.inject(dict(headers or {}))
        if msg_id:
            all_headers["Nats-Msg-Id"] = self.records.msg_id(msg_id)
        all_headers = await self._signed(subject, data, all_headers)
        try:
            ack = await self.js.publish(subject, data, headers=all_headers or None)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"publish {subject}: {exc}", subject=subject) from exc
        return int(ack.seq)

    async def request(
        self,
        subject: str,
        data: bytes,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> Msg:
        """Core NATS request/reply; the current trace context travels in the headers.

        The reply to a node's control subject must come from that node's health agent
        (signatures on): one its signer's node does not own, or one signed for another request,
        raises `ReplyRefusedError`."""
        carrier = telemetry.inject(dict(headers or {}))
        try:
            reply = await self.nc.request(subject, data, timeout=timeout_s, headers=carrier)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"request {subject}: {exc}", subject=subject) from exc
        # A reply arrives on the one-off subject this request gave it.
        bound = self.names.control_reply(subject, reply.subject)
        if self.names.writer_of(bound) is not None:
            check = self.records.check(
                bound, reply.data or b"", reply.headers, event="bus_reply_dropped"
            )
            if not check.ok:
                raise ReplyRefusedError(
                    f"the reply to {subject} was refused ({check.reason}): it is not signed by "
                    "the health agent of that node",
                    subject=subject,
                )
        return reply

    async def reply(self, request: Request, data: bytes) -> None:
        """Answer a request, signed when this process signs: over the request's subject bound
        to its reply subject (`Names.control_reply`), so the answer proves its writer and
        answers only that request."""
        if not request.reply:
            return
        bound = self.names.control_reply(request.subject, request.reply)
        headers = await self._signed(bound, data, {})
        try:
            await self.nc.publish(request.reply, data, headers=headers or None)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(
                f"reply to {request.subject}: {exc}", subject=request.subject
            ) from exc

    async def subscribe(
        self, subject: str, handler: MessageHandler, *, queue: str = ""
    ) -> Subscription:
        """Core subscription for requests (control subjects), in queue group `queue` when
        given. A message that JetStream sent (a consumer delivery or a direct-get answer
        redirected here through someone's reply subject, which nats-server does not police)
        never reaches `handler`."""

        async def guarded(msg: Msg) -> None:
            if _from_jetstream(msg):
                log.warning(
                    "bus_message_dropped", subject=msg.subject, reason="jetstream_reply",
                    security=True,
                )  # fmt: skip
                return
            await handler(msg)

        try:
            return await self.nc.subscribe(subject, queue=queue, cb=guarded)
        except _UNAVAILABLE as exc:
            raise BusUnavailableError(f"subscribe {subject}: {exc}", subject=subject) from exc

    async def serve(self, subject: str, handler: ControlHandler) -> Subscription:
        """`subscribe` for a control subject: the handler's answers are signed (`reply`)."""

        async def signing(msg: Msg) -> None:
            await handler(ControlRequest(self, msg))

        return await self.subscribe(subject, signing)

    async def _signed(self, subject: str, data: bytes, headers: dict[str, str]) -> dict[str, str]:
        """`headers` with this process's certificate and signature (when it signs)."""
        if self.records.writer is None:
            return headers
        await self._certified()
        return self.records.sign(subject, data, headers)

    async def _certified(self) -> None:
        """Have the auth service certify the writer key: at the first write, and again once
        half the certificate's life has passed. While it cannot, writes wait as on a lost
        connection (BusUnavailableError); a renewal that fails keeps the valid certificate."""
        writer = self.records.writer
        assert writer is not None
        if writer.fresh(time.time()):
            return
        async with self._certifying:
            if writer.fresh(time.time()):
                return
            subject, body, headers = self.records.certify_request()
            try:
                reply = await self.nc.request(
                    subject, body, timeout=self.settings.request_timeout_s, headers=headers
                )
                answer = json.loads(reply.data or b"{}")
                if not isinstance(answer, dict) or "certificate" not in answer:
                    error = answer.get("error") if isinstance(answer, dict) else None
                    raise signing.Rejected("bad_certificate", str(error or "no certificate"))
                cert = self.records.install(str(answer["certificate"]))
            except (*_UNAVAILABLE, ValueError) as exc:
                error = str(exc) or type(exc).__name__
                if writer.usable(time.time()):
                    log.warning("bus_certificate_renewal_failed", error=error)
                    return
                raise BusUnavailableError(
                    f"no writer certificate: {error}", subject=subject
                ) from exc
            log.info("bus_writer_certified", role=cert.role, node=cert.node,
                     not_after=cert.not_after)  # fmt: skip

    async def checked_get(self, bucket: str, key: str) -> bytes | None:
        """A direct get whose entry goes through `Records.check` (its stored headers with it):
        None for a missing key, a delete and a record the check refuses. No bucket check."""
        subject = self.names.kv_subject(bucket, key)
        try:
            raw = await self.js.get_msg(self.names.kv_stream(bucket), subject=subject, direct=True)
        except nats.js.errors.NotFoundError:
            return None
        if raw.subject != subject:
            return None
        change = change_of(
            self, subject=subject, key=key, data=raw.data or b"",
            headers=stored_headers(raw.headers or {}), revision=raw.seq or 0,
            stored_at=raw.time.timestamp() if raw.time is not None else None,
            replayed=True, rejected=False,
        )  # fmt: skip
        return change.value if change is not None else None

    def check_message(self, msg: Msg, *, event: str = "bus_message_dropped") -> records.Check:
        """`Records.check` of a stream message (an alert) as a consumer delivered it."""
        stored_at: float | None = None
        with contextlib.suppress(Exception):  # a message of no consumer has no metadata
            stored_at = msg.metadata.timestamp.timestamp()
        return self.records.check(
            msg.subject, msg.data or b"", msg.headers, stored_at=stored_at, event=event
        )


def _valid_key(key: str) -> bool:
    """The key rule of nats-py's `KeyValue.put`, which `kv_put` bypasses to send headers."""
    if not key or key[0] == "." or key[-1] == ".":
        return False
    return all(char.isalnum() or char in "-/_=." for char in key)


def _from_jetstream(msg: Msg) -> bool:
    return origin.is_jetstream_reply(reply=msg.reply, headers=msg.headers, data=msg.data)
