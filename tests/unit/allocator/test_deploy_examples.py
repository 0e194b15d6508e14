"""Every claim under deploy/kustomize/examples/, read as `dractl explain -f` reads a manifest,
explained on a sim node built by the discovery agent's slice code (corpus/deploy_examples.yaml)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from services.allocator.allocator import Cluster
from services.allocator.explanation import explain
from services.allocator.request import read_claim
from services.allocator.result import claim_ref
from services.dractl.explain_manifest import read_manifest
from tests.unit.allocator.corpus import CORPUS
from tests.unit.allocator.sim_cluster import DRIVER, node_slices
from tests.unit.deploy.manifests import KUSTOMIZE

EXAMPLES = yaml.safe_load((CORPUS / "deploy_examples.yaml").read_text())["examples"]
NIC_CLASS = {
    "metadata": {"name": "nic.example.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
}


def _of_kind(docs: Iterable[Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d and d["kind"] == kind]


def _classes(overlay: str) -> list[dict[str, Any]]:
    path = KUSTOMIZE / "overlays" / overlay / "deviceclasses.yaml"
    return [*_of_kind(yaml.safe_load_all(path.read_text()), "DeviceClass"), NIC_CLASS]


def _claims(file: str, classes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    docs = list(yaml.safe_load_all((KUSTOMIZE / "examples" / file).read_text()))
    wanted = [
        d for d in docs if d and d["kind"] in ("ResourceClaim", "ResourceClaimTemplate", "Pod")
    ]
    manifest = read_manifest(wanted, namespace="default")
    claims = [*manifest.claims, *manifest.pod_claims(templates={}, claims={}, classes=classes)]
    return {claim_ref(c): c for c in claims}


def test_every_example_file_is_in_the_corpus():
    files = {
        p.relative_to(KUSTOMIZE / "examples").as_posix()
        for p in (KUSTOMIZE / "examples").rglob("*.yaml")
    }
    files -= {"kustomization.yaml", "k8s-1.36/kustomization.yaml", "kubevirt/kustomization.yaml"}
    assert files == {e["file"] for e in EXAMPLES}


@pytest.mark.parametrize(
    "example", EXAMPLES, ids=[f"{e['file']}:{e.get('claim', '')}" for e in EXAMPLES]
)
async def test_example(example):
    own = yaml.safe_load_all((KUSTOMIZE / "examples" / example["file"]).read_text())
    classes = [*_classes(example.get("overlay", "sim")), *_of_kind(own, "DeviceClass")]
    driver = example.get("driver", DRIVER)
    slices = await node_slices("node-a", profile=example.get("profile", "mixed"), driver=driver)
    cluster = Cluster.build(slices=slices, classes=classes)
    claims = _claims(example["file"], classes)
    chosen = [claims[example["claim"]]] if "claim" in example else list(claims.values())
    for claim in chosen:
        report = explain(cluster, read_claim(claim, cluster.classes), nodes=["node-a"]).nodes[0]
        assert report.fits is example["fits"], report
        if "allocation" in example:
            assert [f"{r.request}={r.device}" for r in report.allocation] == example["allocation"]
        if "reason" in example:
            reason = example["reason"]
            (alternative,) = [a for a in report.requests if a.name == reason["request"]]
            verdicts = {v.device.rsplit("/", 1)[1]: v.exclusion for v in alternative.devices}
            assert verdicts[reason["device"]].rule == reason["rule"]
