"""HealthConfig: everything the health agent is told at start, validated before any I/O.

Composed of the shared settings groups plus the agent's own fields; `cli.py` fills it from
flags, their env twins and defaults. Invalid values raise `ConfigError` (exit 2).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from shared.config import (
    KubeSettings,
    LogSettings,
    NATSSettings,
    OpsSettings,
    TelemetrySettings,
    setting,
)
from shared.errors import ConfigError
from shared.vendors import registry

__all__ = ["EFFECTS", "MONITORS", "TAINT_TARGETS", "HealthConfig"]

MONITORS = registry.NAMES
EFFECTS = ("NoSchedule", "NoExecute", "None")
TAINT_TARGETS = ("rule", "slice")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthConfig:
    nats: NATSSettings = field(default_factory=NATSSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    log: LogSettings = field(default_factory=LogSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    ops: OpsSettings = field(default_factory=OpsSettings)

    node_name: str = setting(
        "", flag="--node-name", help="This node's name (the pool name); empty: the host name."
    )
    """Node this agent watches; also the pool name of its devices."""

    driver_name: str = setting("sim.dra-suite.io", flag="--driver-name", help="DRA driver name.")
    """DRA driver name; the prefix of every taint key."""

    monitor: str = setting("sim", flag="--monitor", help="Device monitor: sim, nvml or ascend.")
    """Which `DeviceMonitor` watches the devices."""

    sim_profile: str = setting(
        "mixed", flag="--sim-profile", help="Sim profile name or path; its faults apply at start."
    )
    """Sim profile whose `faults` are present from the start (the sim monitor only)."""

    poll_interval_s: float = setting(
        1.0, flag="--poll-interval-s", help="Seconds between policy evaluations without news."
    )
    """Upper bound between two evaluation passes; new observations trigger one at once. A
    pass whose inputs did not change since one that changed nothing judges nothing again."""

    recovery_hold_s: float = setting(
        5.0,
        flag="--recovery-hold-s",
        help="Seconds a faulty device must stay healthy before its taint is removed.",
    )
    """Hysteresis: a device that flaps within this time keeps its one taint."""

    flap_window_s: float = setting(
        5.0,
        flag="--flap-window-s",
        help="Least seconds between two changes of a device's taint (a first taint never waits).",
    )
    """Damping: a flapping device changes its taint at most once per window."""

    taint_effect: str = setting(
        "NoSchedule",
        flag="--taint-effect",
        help="Effect of fatal and transient faults' taints unless the policy file says otherwise.",
    )
    """Default effect of the fatal and transient classes: NoSchedule, NoExecute or None."""

    taint_target: str = setting(
        "rule",
        flag="--taint-target",
        help="Where device taints go: rule (DeviceTaintRules written by this agent) or slice "
        "(the health records' taints, published in the ResourceSlice by the discovery agent).",
    )
    """`slice`: no DeviceTaintRules (those left by an earlier run are deleted, their drains
    kept); the records' `taints` are the only output, and drains persist in the records."""

    policy_file: str = setting(
        "",
        flag="--policy-file",
        help="YAML policy file (fault classes, effects, ignore lists); empty: built-in rules.",
    )
    """Optional policy file; see docs/operations.md, "Health policy, taint keys and alerts"."""

    additional_xids_to_ignore: tuple[str, ...] = setting(
        (),
        flag="--additional-xids-to-ignore",
        help="Comma-separated XIDs to ignore beside the policy's list (the application XIDs "
        "13, 31, 43, 45, 68, 109 unless the policy file replaces it).",
    )
    """Added to the policy's XID ignore list after the policy file, as NVIDIA's plugins'
    `ADDITIONAL_XIDS_TO_IGNORE` does."""

    monitor_deadline_s: float = setting(
        30.0,
        flag="--monitor-deadline-s",
        help="Seconds without a report after which the monitor's devices become unmonitored.",
    )
    """A monitor silent this long (or one that fails) marks its devices UNKNOWN."""

    npu_smi_path: str = setting(
        "npu-smi", flag="--npu-smi-path", help="The npu-smi binary (ascend monitor)."
    )
    """Path or name (looked up on PATH) of npu-smi."""

    npu_smi_timeout_s: float = setting(
        10.0, flag="--npu-smi-timeout-s", help="Deadline of one npu-smi run (ascend monitor)."
    )
    """An npu-smi run that takes longer is killed and counts as a monitor failure."""

    ascend_poll_s: float = setting(
        5.0, flag="--ascend-poll-s", help="Seconds between npu-smi polls (ascend monitor)."
    )
    """Poll period; the Ascend device plugin's default listWatchPeriod is 5 s."""

    ascend_unknown_codes: str = setting(
        "isolate",
        flag="--ascend-unknown-codes",
        help="Error codes not in the built-in table: isolate (a fault) or ignore, unless the "
        "policy file says otherwise.",
    )
    """What an unknown npu-smi error code does; `isolate` as the vendor's plugin does. The
    policy file's `ascend_unknown_codes` wins over it."""

    nvml_event_timeout_ms: int = setting(
        5000,
        flag="--nvml-event-timeout-ms",
        help="Timeout of one NVML event wait (nvml monitor); a timeout is no fault.",
    )
    """NVIDIA's plugins wait 5000 ms; the monitor re-reports its view after each wait."""

    nvml_counters_s: float = setting(
        30.0,
        flag="--nvml-counters-s",
        help="Seconds between reads of the ECC, row-remap and page-retirement counters (nvml).",
    )
    """Period of the nvml monitor's counter check."""

    event_namespace: str = setting(
        "default", flag="--event-namespace", help="Namespace of the Node Events we write."
    )
    """Namespace of Node Events; a real API server accepts Node Events only in `default`."""

    alert_max_age_s: float = setting(
        7 * 24 * 3600.0, flag="--alert-max-age-s", help="How long the alerts stream keeps alerts."
    )
    """Retention of the alerts JetStream stream."""

    alert_queue_size: int = setting(
        1000, flag="--alert-queue-size", help="Alerts kept while NATS is down (oldest dropped)."
    )
    """Bound of the pending-alert queue while NATS is unreachable."""

    health_refresh_s: float = setting(
        600.0,
        flag="--health-refresh-s",
        help="Mean seconds between rewrites of an unchanged health record (jittered by up "
        "to half).",
    )
    """Unchanged records are rewritten about this often, so `updated_unix_ms` shows the agent
    is alive (a record older than twice this says it is not). A change is written at once; at
    600 s a node of 8 devices sends 0.8 messages a minute at rest."""

    alert_webhook_url: str = setting(
        "",
        flag="--alert-webhook-url",
        help="Alertmanager-compatible URL alerts are POSTed to, e.g. "
        "http://alertmanager:9093/api/v2/alerts; empty: off.",
    )
    """Optional webhook receiving alerts as Alertmanager API v2 postableAlerts (full path)."""

    alert_webhook_timeout_s: float = setting(
        5.0, flag="--alert-webhook-timeout-s", help="Deadline of one webhook POST."
    )
    """A POST that takes longer counts as a failed attempt."""

    alert_webhook_attempts: int = setting(
        5, flag="--alert-webhook-attempts", help="Attempts per webhook POST before it is dropped."
    )
    """Bound on the jittered retries of one POST (connection errors, timeouts, 408, 429, 5xx)."""

    alert_webhook_queue_size: int = setting(
        1000,
        flag="--alert-webhook-queue-size",
        help="Alerts kept for the webhook while it is slow or down (oldest dropped).",
    )
    """Bound of the webhook's in-memory queue."""

    alert_webhook_resend_s: float = setting(
        60.0,
        flag="--alert-webhook-resend-s",
        help="Seconds between re-sends of still-raised alerts (keeps Alertmanager from "
        "resolving them).",
    )
    """Alertmanager resolves an alert not re-sent within its resolve_timeout (default 5 min)."""

    def __post_init__(self) -> None:
        registry.require(self.monitor, field="monitor")
        if len(self.driver_name) > 63 or not _DNS_SUBDOMAIN.match(self.driver_name):
            raise ConfigError(
                f"driver name {self.driver_name!r} is not a DNS subdomain of at most 63 characters",
                field="driver_name",
            )
        if self.node_name and (
            len(self.node_name) > 253 or not _DNS_SUBDOMAIN.match(self.node_name)
        ):
            raise ConfigError(
                f"node name {self.node_name!r} is not a DNS subdomain", field="node_name"
            )
        if self.taint_effect not in EFFECTS:
            raise ConfigError(
                f"taint effect {self.taint_effect!r} is not one of {', '.join(EFFECTS)}",
                field="taint_effect",
            )
        if self.taint_target not in TAINT_TARGETS:
            raise ConfigError(
                f"taint target {self.taint_target!r} is not one of {', '.join(TAINT_TARGETS)}",
                field="taint_target",
            )
        bad_xids = [x for x in self.additional_xids_to_ignore if not (x.isascii() and x.isdigit())]
        if bad_xids:
            raise ConfigError(
                f"additional XIDs to ignore {bad_xids} are not XID numbers",
                field="additional_xids_to_ignore",
            )
        if self.ascend_unknown_codes not in ("isolate", "ignore"):
            raise ConfigError(
                f"ascend unknown codes {self.ascend_unknown_codes!r} is not isolate or ignore",
                field="ascend_unknown_codes",
            )
        if not _DNS_LABEL.match(self.event_namespace) or len(self.event_namespace) > 63:
            raise ConfigError(
                f"event namespace {self.event_namespace!r} is not a DNS label",
                field="event_namespace",
            )
        self._check_positive()
        self._check_webhook_url()

    def _check_webhook_url(self) -> None:
        if not self.alert_webhook_url:
            return
        try:
            url = urllib.parse.urlsplit(self.alert_webhook_url)
            valid = url.scheme in ("http", "https") and bool(url.hostname)
        except ValueError:  # e.g. an unclosed IPv6 bracket
            valid = False
        if not valid:
            raise ConfigError(
                f"alert webhook URL {self.alert_webhook_url!r} is not an http(s) URL",
                field="alert_webhook_url",
            )

    def _check_positive(self) -> None:
        for name, value, minimum in (
            ("poll_interval_s", self.poll_interval_s, 0.01),
            ("alert_max_age_s", self.alert_max_age_s, 1.0),
            ("health_refresh_s", self.health_refresh_s, 0.1),
            ("alert_queue_size", self.alert_queue_size, 1),
            ("monitor_deadline_s", self.monitor_deadline_s, 0.1),
            ("npu_smi_timeout_s", self.npu_smi_timeout_s, 0.1),
            ("ascend_poll_s", self.ascend_poll_s, 0.1),
            ("nvml_event_timeout_ms", self.nvml_event_timeout_ms, 1),
            ("nvml_counters_s", self.nvml_counters_s, 0.1),
            ("alert_webhook_timeout_s", self.alert_webhook_timeout_s, 0.01),
            ("alert_webhook_attempts", self.alert_webhook_attempts, 1),
            ("alert_webhook_queue_size", self.alert_webhook_queue_size, 1),
            ("alert_webhook_resend_s", self.alert_webhook_resend_s, 0.1),
        ):
            if value < minimum:
                raise ConfigError(f"{name} must be at least {minimum}, got {value}", field=name)
        for name, value in (
            ("recovery_hold_s", self.recovery_hold_s),
            ("flap_window_s", self.flap_window_s),
        ):
            if value < 0:
                raise ConfigError(f"{name} must not be negative", field=name)
