"""What `dractl explain` does once its flags are parsed (services/dractl/commands/explain.py:
the command, its flags and exit codes): read the cluster, run the allocator, render the
explanations."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from services.allocator.allocator import Cluster
from services.allocator.errors import ClaimError
from services.allocator.explanation import (
    Explanation,
    PodExplanation,
    explain,
    explain_pod,
    selects_driver,
)
from services.allocator.request import read_claim
from services.allocator.result import Holdings, allocated_results, claim_ref
from services.dractl import explain_view
from services.dractl.commands.explain import NAMESPACES
from services.dractl.explain_manifest import (
    Manifest,
    ManifestError,
    admin_access_problem,
    read_manifest,
)
from shared import yamlload
from shared.config import KubeSettings, from_args
from shared.errors import DraSuiteError, KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient

__all__ = ["ExplainInputError", "UnknownNodeError", "explain_claims", "run"]

Obj = dict[str, Any]
RESOURCE_CLAIM_TEMPLATES = resources.ResourceType(
    resources.RESOURCE_GROUP, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2


class ExplainInputError(Exception):
    """What `dractl explain` was given cannot be explained."""


class UnknownNodeError(Exception):
    """`--node` names a node that has no devices (or does not exist): nothing fits there."""


async def run(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """The subcommand (reads the API server, not the bus): the explanations on `out` (stdout),
    errors on `err` (stderr), where they become exit code 2."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        settings = from_args(KubeSettings, args, os.environ)
        documents = _documents(args)
        kube = await KubeClient.connect(settings)
        try:
            explanations = await explain_claims(
                kube,
                claim=args.claim,
                namespace=args.namespace,
                documents=documents,
                node=args.node,
                driver=getattr(args, "driver_name", None),
                notes=err,
            )
            statuses = await _device_statuses(kube, explanations)
        finally:
            await kube.close()
    except UnknownNodeError as exc:
        print(f"dractl explain: {exc}", file=err)
        return EXIT_DOES_NOT_FIT
    except (ExplainInputError, ManifestError, ClaimError, DraSuiteError) as exc:
        print(f"dractl explain: {exc}", file=err)
        return EXIT_BAD_INPUT
    _render(explanations, statuses, output=getattr(args, "output", None), out=out)
    return EXIT_FITS if all(e.fits for e in explanations) else EXIT_DOES_NOT_FIT


def _documents(args: argparse.Namespace) -> list[Any] | None:
    if bool(args.claim) == bool(args.filename):
        raise ExplainInputError("give a claim name or -f FILE, not both or neither")
    if not args.filename:
        return None
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        return yamlload.load_all(text)
    except (OSError, yaml.YAMLError) as exc:
        raise ExplainInputError(f"{args.filename}: {exc}") from exc


async def _device_statuses(
    kube: KubeClient, explanations: Sequence[Explanation | PodExplanation]
) -> dict[str, list[Obj]]:
    """The `status.devices` (KEP-4817: the drivers' conditions) of the explained claims that
    exist in the cluster, by claim reference."""
    found: dict[str, list[Obj]] = {}
    for explanation in explanations:
        if isinstance(explanation, PodExplanation) or "/" not in explanation.claim:
            continue
        namespace, name = explanation.claim.split("/", 1)
        claim = await _get(kube, resources.RESOURCE_CLAIMS, (namespace, name))
        devices = ((claim or {}).get("status") or {}).get("devices") or []
        found[explanation.claim] = [d for d in devices if isinstance(d, dict)]
    return found


def _render(
    explanations: Sequence[Explanation | PodExplanation],
    statuses: Mapping[str, Sequence[Obj]],
    *,
    output: str | None,
    out: TextIO,
) -> None:
    data = [
        explain_view.as_data(e, status=statuses.get(e.claim, ()))
        if isinstance(e, Explanation)
        else explain_view.as_data(e)
        for e in explanations
    ]
    if output == "json":
        json.dump(data[0] if len(data) == 1 else data, out, indent=2)
        out.write("\n")
    elif output == "yaml":
        yaml.safe_dump(data[0] if len(data) == 1 else data, out, sort_keys=False)
    else:
        explain_view.table(explanations, out=out, statuses=statuses, wide=output == "wide")


async def explain_claims(
    kube: KubeClient,
    *,
    claim: str | None,
    namespace: str,
    documents: Sequence[Any] | None,
    node: str | None,
    driver: str | None,
    notes: TextIO | None = None,
) -> list[Explanation | PodExplanation]:
    """Explain the named claim, or those the manifest stands for, against the cluster; a
    pod with several claims also gets whether they fit together. `notes` hears of skipped
    manifest documents."""
    state = await _cluster_state(kube)
    pods: list[tuple[str, list[Obj]]] = []
    namespaces: dict[str, Obj] = {}
    if documents is None:
        assert claim is not None
        try:
            claims = [await kube.get(resources.RESOURCE_CLAIMS, claim, namespace=namespace)]
        except KubeNotFoundError as exc:
            raise ExplainInputError(f"resourceclaim {namespace}/{claim} not found") from exc
        classes = state["classes"]
    else:
        manifest = read_manifest(documents, namespace=namespace)
        if manifest.skipped and notes is not None:
            skipped = ", ".join(manifest.skipped)
            notes.write(f"dractl explain: skipped {skipped} (not a claim, template or pod)\n")
        namespaces = dict(manifest.namespaces)
        classes = [*state["classes"], *manifest.classes]
        pods = await _pod_groups(kube, manifest, classes)
        claims = _unique([*manifest.claims, *(c for _, group in pods for c in group)])
    await _check_admin_access(kube, claims, namespaces)
    base = Cluster.build(slices=state["slices"], classes=classes, taint_rules=state["taint_rules"])
    if node and node not in base.inventory.nodes:
        raise UnknownNodeError(await _unknown_node(kube, node, known=base.inventory.nodes))
    nodes = [node] if node else base.inventory.nodes
    answers: list[Explanation | PodExplanation] = [
        _explain_one(base, wanted, others=state["claims"], nodes=nodes, driver=driver)
        for wanted in claims
    ]
    for pod, group in pods:
        if len(group) > 1:
            answers.append(_together(base, pod, group, others=state["claims"], nodes=nodes))
    return answers


async def _check_admin_access(
    kube: KubeClient, claims: Sequence[Obj], namespaces: dict[str, Obj]
) -> None:
    """Refuse, as the API server does, a claim whose admin access its namespace does not allow;
    the manifest's Namespaces count before the cluster's."""
    for claim in claims:
        name = claim["metadata"].get("namespace") or "default"
        if admin_access_problem(claim, {}) is None:
            continue  # asks for no admin access: no namespace to read
        if name not in namespaces:
            found = await _get(kube, NAMESPACES, ("", name))
            namespaces[name] = found if found is not None else {}
        problem = admin_access_problem(claim, namespaces[name] or None)
        if problem is not None:
            raise ExplainInputError(
                f"claim {claim_ref(claim)}: the API server rejects it: {problem}"
            )


async def _unknown_node(kube: KubeClient, node: str, *, known: Sequence[str]) -> str:
    listed = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "") or "none"
    if await _get(kube, resources.NODES, ("", node)) is None:
        return f"no such node: {node} (nodes with devices: {listed})"
    return f"node {node} has no devices: no ResourceSlice names it (nodes with devices: {listed})"


def _unique(claims: Iterable[Obj]) -> list[Obj]:
    seen: dict[str, Obj] = {}
    for claim in claims:
        seen.setdefault(claim_ref(claim), claim)
    return list(seen.values())


def _together(
    base: Cluster, pod: str, group: Sequence[Obj], *, others: Sequence[Obj], nodes: Sequence[str]
) -> PodExplanation:
    """Whether the pod's claims fit together; none of them holds anything meanwhile."""
    refs = {claim_ref(c) for c in group}
    held = [c for c in others if claim_ref(c) not in refs]
    cluster = dataclasses.replace(base, holdings=Holdings.of(allocated_results(held)))
    specs = [read_claim(c, base.classes) for c in group]
    return explain_pod(cluster, pod, specs, nodes=nodes)


def _explain_one(
    base: Cluster, claim: Obj, *, others: Sequence[Obj], nodes: Sequence[str], driver: str | None
) -> Explanation:
    spec = read_claim(claim, base.classes)
    ref = claim_ref(claim)
    uid = (claim.get("metadata") or {}).get("uid")
    held = [
        c for c in others if claim_ref(c) != ref and (not uid or c["metadata"].get("uid") != uid)
    ]
    cluster = dataclasses.replace(base, holdings=Holdings.of(allocated_results(held)))
    explanation = explain(cluster, spec, nodes=nodes)
    if not explanation.fits and driver and selects_driver(cluster, spec, driver=driver) is False:
        raise ClaimError(
            f"claim {ref} asks only for devices of other drivers: its device classes select "
            f"none of the {driver} devices"
        )
    return explanation


async def _pod_groups(
    kube: KubeClient, manifest: Manifest, classes: list[Obj]
) -> list[tuple[str, list[Obj]]]:
    wanted_templates, wanted_claims = manifest.wanted()
    templates = {ref: await _get(kube, RESOURCE_CLAIM_TEMPLATES, ref) for ref in wanted_templates}
    claims = {ref: await _get(kube, resources.RESOURCE_CLAIMS, ref) for ref in wanted_claims}
    return manifest.pod_groups(
        templates={k: v for k, v in templates.items() if v is not None},
        claims={k: v for k, v in claims.items() if v is not None},
        classes=classes,
    )


async def _get(kube: KubeClient, rt: resources.ResourceType, ref: tuple[str, str]) -> Obj | None:
    try:
        return await kube.get(rt, ref[1], namespace=ref[0])
    except KubeNotFoundError:
        return None


async def _cluster_state(kube: KubeClient) -> dict[str, list[Obj]]:
    return {
        "slices": (await kube.list(resources.RESOURCE_SLICES))["items"],
        "classes": (await kube.list(resources.DEVICE_CLASSES))["items"],
        "claims": (await kube.list(resources.RESOURCE_CLAIMS))["items"],
        "taint_rules": await _taint_rules(kube),
    }


async def _taint_rules(kube: KubeClient) -> list[Obj]:
    """DeviceTaintRules in the first version the server serves them in; none when it does
    not (device taints off)."""
    served = await kube.served_versions(resources.RESOURCE_GROUP)
    for version in TAINT_RULE_VERSIONS:
        if version not in served:
            continue
        try:
            return list((await kube.list(resources.device_taint_rules(version)))["items"])
        except KubeNotFoundError:
            continue
    return []
