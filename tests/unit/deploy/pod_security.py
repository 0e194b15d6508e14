"""The Pod Security Standards (baseline and restricted, as the PodSecurity admission plugin of
Kubernetes 1.34-1.36 enforces them) over a pod spec: which controls it breaks at each level."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

LEVELS = ("restricted", "baseline", "privileged")
"""Strictest first: the least privileged level that admits a pod is the first it passes."""

_BASELINE_CAPABILITIES = {
    *("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD"),
    *("NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"),
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_SAFE_SYSCTLS = {
    *("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies"),
    *("net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start"),
    *("net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time"),
    *("net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"),
}
_RESTRICTED_VOLUMES = {
    *("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral"),
    *("persistentVolumeClaim", "projected", "secret"),
}


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _contexts(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The pod's security context, then each container's."""
    yield pod.get("securityContext") or {}
    for container in _containers(pod):
        yield container.get("securityContext") or {}


def baseline_violations(pod: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    if any((c.get("windowsOptions") or {}).get("hostProcess") for c in _contexts(pod)):
        found.add("hostProcess")
    if any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.add("host namespaces")
    if any(c.get("privileged") for c in _contexts(pod)):
        found.add("privileged")
    for context in _contexts(pod):
        if set((context.get("capabilities") or {}).get("add") or []) - _BASELINE_CAPABILITIES:
            found.add("capabilities")
        if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
            found.add("appArmor")
        selinux = context.get("seLinuxOptions") or {}
        if (
            selinux.get("type", "") not in _SELINUX_TYPES
            or selinux.get("user")
            or selinux.get("role")
        ):
            found.add("seLinux")
        if context.get("procMount", "Default") != "Default":
            found.add("procMount")
        if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
            found.add("seccomp")
    if any("hostPath" in volume for volume in pod.get("volumes") or []):
        found.add("hostPath volumes")
    if any(p.get("hostPort") for c in _containers(pod) for p in c.get("ports") or []):
        found.add("hostPorts")
    sysctls = (pod.get("securityContext") or {}).get("sysctls") or []
    if {s["name"] for s in sysctls} - _SAFE_SYSCTLS:
        found.add("sysctls")
    return found


def restricted_violations(pod: dict[str, Any]) -> set[str]:
    found = baseline_violations(pod)
    pod_context = pod.get("securityContext") or {}
    containers = list(_containers(pod))
    if any(set(volume) - {"name"} - _RESTRICTED_VOLUMES for volume in pod.get("volumes") or []):
        found.add("volume types")
    for container in containers:
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            found.add("allowPrivilegeEscalation")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            found.add("runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.add("runAsUser")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get(
            "type"
        )
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.add("seccomp")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.add("capabilities")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.add("capabilities")
    if pod_context.get("runAsUser") == 0:
        found.add("runAsUser")
    return found


def violations(pod: dict[str, Any], level: str) -> set[str]:
    if level == "privileged":
        return set()
    return baseline_violations(pod) if level == "baseline" else restricted_violations(pod)


def least_level(pod: dict[str, Any]) -> str:
    """The strictest Pod Security level that admits `pod`."""
    return next(level for level in LEVELS if not violations(pod, level))


def pod_templates(objects: Any) -> dict[str, dict[str, Any]]:
    """kind/name -> pod spec of every workload among rendered `objects`."""
    return {
        f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["spec"]
        for o in objects
        if o.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "Job")
    }
