"""The claims a manifest stands for, as the API server and kube-scheduler would make them (pure).

A ResourceClaim is itself. A ResourceClaimTemplate stands for the claim made from it. A Pod
stands for the claims of its `spec.resourceClaims` (a named claim, or one made from a
template) and, for extended resources a DeviceClass backs (KEP-5004: the class's
`extendedResourceName`, or `deviceclass.resource.kubernetes.io/<class>`), one claim with a
request per container and resource. DeviceClasses in the manifest are used beside the
cluster's, and its Namespaces beside the cluster's (their labels decide admin access). Other
kinds (a Deployment, a DaemonSet next to its claim template) are skipped and listed in
`skipped`; a manifest without a claim, template or pod is refused, so a typo does not pass as
"fits".

Admin access (KEP-5018): the API server admits a claim or template with an `adminAccess`
request only in a namespace labelled `resource.kubernetes.io/admin-access: "true"`;
`admin_access_problem` says why it would not, in the API server's words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ADMIN_ACCESS_LABEL",
    "Manifest",
    "ManifestError",
    "admin_access_problem",
    "read_manifest",
]

Obj = dict[str, Any]
Ref = tuple[str, str]
"""(namespace, name)."""
_IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
_EXPLAINED = ("ResourceClaim", "ResourceClaimTemplate", "Pod", "DeviceClass", "Namespace")


class ManifestError(Exception):
    """A manifest dractl cannot explain: bad input."""


@dataclass(frozen=True, slots=True)
class Manifest:
    claims: tuple[Obj, ...] = ()
    """Claims given whole (ResourceClaim documents, claims made from templates in the file)."""
    pods: tuple[Obj, ...] = ()
    classes: tuple[Obj, ...] = ()
    templates: Mapping[Ref, Obj] = field(default_factory=dict)
    namespaces: Mapping[str, Obj] = field(default_factory=dict)
    """Namespace documents by name."""
    skipped: tuple[str, ...] = ()
    """`Kind/name` of the documents of other kinds, in order."""

    def wanted(self) -> tuple[set[Ref], set[Ref]]:
        """(templates, claims) the pods name that the manifest does not hold."""
        templates, claims = set(), set()
        for pod in self.pods:
            namespace = pod["metadata"]["namespace"]
            for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
                if entry.get("resourceClaimTemplateName"):
                    ref = (namespace, entry["resourceClaimTemplateName"])
                    if ref not in self.templates:
                        templates.add(ref)
                elif entry.get("resourceClaimName"):
                    claims.add((namespace, entry["resourceClaimName"]))
        return templates, claims

    def pod_claims(
        self,
        *,
        templates: Mapping[Ref, Obj],
        claims: Mapping[Ref, Obj],
        classes: Sequence[Obj],
    ) -> list[Obj]:
        """The claims of the pods, with `templates` and `claims` read from the cluster."""
        found: list[Obj] = []
        own = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self.claims}
        for pod in self.pods:
            for claim in _pod_claims(pod, {**templates, **self.templates}, {**claims, **own}):
                if not any(claim is c for c in self.claims):  # explained once, as itself
                    found.append(claim)
            extended = _extended_claim(pod, [*classes, *self.classes])
            if extended is not None:
                found.append(extended)
        return found

    def pod_groups(
        self,
        *,
        templates: Mapping[Ref, Obj],
        claims: Mapping[Ref, Obj],
        classes: Sequence[Obj],
    ) -> list[tuple[str, list[Obj]]]:
        """(`namespace/pod`, every claim of the pod) per pod, for allocating them together."""
        own = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self.claims}
        groups = []
        for pod in self.pods:
            found = _pod_claims(pod, {**templates, **self.templates}, {**claims, **own})
            extended = _extended_claim(pod, [*classes, *self.classes])
            if extended is not None:
                found.append(extended)
            groups.append((f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", found))
        return groups


def read_manifest(documents: Sequence[Any], *, namespace: str) -> Manifest:
    claims, pods, classes, templates = [], [], [], {}
    namespaces: dict[str, Obj] = {}
    skipped: list[str] = []
    for index, doc in enumerate(d for d in documents if d is not None):
        if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
            raise ManifestError(f"document #{index}: not a Kubernetes object with metadata")
        kind = doc.get("kind")
        if kind not in _EXPLAINED:
            skipped.append(f"{kind}/{doc['metadata'].get('name', '')}")
            continue
        doc = {**doc, "metadata": {"namespace": namespace, **doc["metadata"]}}
        if not doc["metadata"].get("name"):
            raise ManifestError(f"document #{index}: {kind} without metadata.name")
        if kind == "ResourceClaim":
            claims.append(doc)
        elif kind == "ResourceClaimTemplate":
            ref = (doc["metadata"]["namespace"], doc["metadata"]["name"])
            templates[ref] = doc
            claims.append(_from_template(doc, name=doc["metadata"]["name"]))
        elif kind == "Pod":
            pods.append(doc)
        elif kind == "DeviceClass":
            classes.append(doc)
        else:
            namespaces[doc["metadata"]["name"]] = doc
    if not claims and not pods:
        found = f" (found {', '.join(skipped)})" if skipped else ""
        raise ManifestError(f"no ResourceClaim, ResourceClaimTemplate or Pod to explain{found}")
    return Manifest(
        tuple(claims), tuple(pods), tuple(classes), templates, namespaces, tuple(skipped)
    )


def admin_access_problem(claim: Obj, namespace: Obj | None) -> str | None:
    """Why the API server would refuse `claim` for its admin access in `namespace` (None: the
    namespace does not exist), or None when it would not.

    As kube-apiserver's `AuthorizedForAdmin`: only `exactly` requests can ask for it, the first
    one that does is named, and the namespace must carry the label with the value "true".
    """
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    index = next(
        (i for i, r in enumerate(requests) if ((r or {}).get("exactly") or {}).get("adminAccess")),
        None,
    )
    if index is None:
        return None
    where = f"spec.devices.requests[{index}].adminAccess"
    name = claim["metadata"].get("namespace", "")
    if namespace is None:
        return (
            f"{where}: Internal error: could not retrieve namespace to verify admin access: "
            f'namespaces "{name}" not found'
        )
    labels = (namespace.get("metadata") or {}).get("labels") or {}
    if labels.get(ADMIN_ACCESS_LABEL) != "true":
        return (
            f"{where}: Forbidden: admin access to devices requires the "
            f"`{ADMIN_ACCESS_LABEL}: true` label on the containing namespace"
        )
    return None


def _from_template(template: Obj, *, name: str) -> Obj:
    spec = (template.get("spec") or {}).get("spec")
    if not isinstance(spec, dict):
        raise ManifestError(f"ResourceClaimTemplate {template['metadata']['name']}: no spec.spec")
    meta = {"name": name, "namespace": template["metadata"]["namespace"]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": spec,
    }


def _pod_claims(pod: Obj, templates: Mapping[Ref, Obj], claims: Mapping[Ref, Obj]) -> list[Obj]:
    namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    found = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimTemplateName"):
            template = templates.get((namespace, entry["resourceClaimTemplateName"]))
            if template is None:
                raise ManifestError(
                    f"pod {namespace}/{pod_name}: ResourceClaimTemplate "
                    f"{entry['resourceClaimTemplateName']} not found"
                )
            found.append(_from_template(template, name=f"{pod_name}-{entry.get('name', 'claim')}"))
        elif entry.get("resourceClaimName"):
            claim = claims.get((namespace, entry["resourceClaimName"]))
            if claim is None:
                raise ManifestError(
                    f"pod {namespace}/{pod_name}: ResourceClaim {entry['resourceClaimName']} "
                    "not found"
                )
            found.append(claim)
    return found


def _extended_claim(pod: Obj, classes: Sequence[Obj]) -> Obj | None:
    by_resource = {}
    for device_class in classes:
        name = device_class["metadata"]["name"]
        by_resource[_IMPLICIT_PREFIX + name] = name
        explicit = (device_class.get("spec") or {}).get("extendedResourceName")
        if explicit:
            by_resource[explicit] = name
    requests = []
    for c, container in enumerate((pod.get("spec") or {}).get("containers") or []):
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for r, (resource, amount) in enumerate(sorted(wanted.items())):
            if resource in by_resource:
                try:
                    count = int(str(amount))
                except ValueError as exc:
                    raise ManifestError(
                        f"pod {pod['metadata']['name']}: {resource}: {amount!r} is not a count"
                    ) from exc
                exactly = {
                    "deviceClassName": by_resource[resource],
                    "allocationMode": "ExactCount",
                    "count": count,
                }
                requests.append({"name": f"container-{c}-request-{r}", "exactly": exactly})
    if not requests:
        return None
    meta = {
        "name": f"{pod['metadata']['name']}-extended-resources",
        "namespace": pod["metadata"]["namespace"],
    }
    return {"kind": "ResourceClaim", "metadata": meta, "spec": {"devices": {"requests": requests}}}
