"""The scenario corpus (corpus/*.yaml): a compact notation for devices, classes, claims, other
claims' allocations and taint rules, turned into the API objects the allocator reads.

Notation (defaults in brackets):
- device: `{name, attrs: {numa: 0, ring: r0, ver: "v:1.2.3"}, cap: {mem: 32Gi | {value, policy}},
  taints: [...], shared: bool, consumes: {set: {counter: amount}}, bindingConditions}`;
- pool: `{name [node-a], node [name], driver [file's], generation [1], count [#slices],
  allNodes, slices: [{name, devices, counters: {set: {counter: amount}}}]}`; a scenario's
  `devices` is one pool `node-a` of one slice;
- request: raw (`exactly`/`firstAvailable`) or `{name, class [npu], count [1], mode, cel,
  admin, tolerations, capacity, alternatives: [same, with a name]}`;
- other claim: `{name, results: [{device, pool [node-a], driver, share: {cap: amount},
  admin}]}`; taint rule: `{name, device, pool, driver, key, value, effect [NoSchedule]}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["CORPUS", "Scenario", "load"]

Obj = dict[str, Any]
CORPUS = Path(__file__).parent / "corpus"
DRIVER = "sim.dra-suite.io"


class Scenario:
    def __init__(self, raw: Obj, defaults: Obj, *, source: str) -> None:
        self.raw = {**defaults, **raw}
        self.name = f"{source}:{raw['name']}"
        self.driver: str = self.raw.get("driver", DRIVER)
        self.node: str = self.raw.get("node", "node-a")
        self.expect: Obj = raw["expect"]

    def slices(self) -> list[Obj]:
        pools = self.raw.get("pools")
        if pools is None:
            pools = [{"slices": [{"devices": self.raw.get("devices", [])}]}]
        return [s for pool in pools for s in self._pool(pool)]

    def _pool(self, pool: Obj) -> list[Obj]:
        name = pool.get("name", "node-a")
        driver = pool.get("driver", self.driver)
        slices = pool.get("slices") or [{"devices": pool.get("devices", [])}]
        out = []
        for i, item in enumerate(slices):
            spec: Obj = {
                "driver": driver,
                "pool": {
                    "name": name,
                    "generation": item.get("generation", pool.get("generation", 1)),
                    "resourceSliceCount": pool.get("count", len(slices)),
                },
                "devices": [_device(d) for d in item.get("devices", [])],
            }
            if self.raw.get("perDevice"):
                spec["perDeviceNodeSelection"] = True
            elif pool.get("allNodes"):
                spec["allNodes"] = True
            else:
                spec["nodeName"] = pool.get("node", name)
            if item.get("counters"):
                spec["sharedCounters"] = [
                    {"name": n, "counters": {c: {"value": str(v)} for c, v in cs.items()}}
                    for n, cs in item["counters"].items()
                ]
            slice_name = item.get("name", f"{name}-{driver}-{i}")
            out.append({"metadata": {"name": slice_name}, "spec": spec})
        return out

    def classes(self) -> list[Obj]:
        classes = {**_DEFAULT_CLASSES, **(self.raw.get("classes") or {})}
        out = []
        for name, cel in classes.items():
            expressions = [] if cel is None else [cel] if isinstance(cel, str) else cel
            selectors = [{"cel": {"expression": e}} for e in expressions]
            out.append({"metadata": {"name": name}, "spec": {"selectors": selectors}})
        return out

    def claim(self) -> Obj:
        devices: Obj = {"requests": [_request(r) for r in self.raw["requests"]]}
        if self.raw.get("constraints"):
            devices["constraints"] = self.raw["constraints"]
        meta = {"name": "claim", "namespace": "default", "uid": "claim-uid"}
        return {"metadata": meta, "spec": {"devices": devices}}

    def other_claims(self) -> list[Obj]:
        claims = []
        for i, other in enumerate(self.raw.get("others") or []):
            results: list[Obj] = []
            for r in other["results"]:
                result: Obj = {
                    "request": r.get("request", "r"),
                    "driver": r.get("driver", self.driver),
                    "pool": r.get("pool", "node-a"),
                    "device": r["device"],
                }
                if r.get("admin"):
                    result["adminAccess"] = True
                if "share" in r:
                    result["shareID"] = f"00000000-0000-0000-0000-{i:06d}{len(results):06d}"
                    result["consumedCapacity"] = {k: str(v) for k, v in r["share"].items()}
                results.append(result)
            meta = {"name": other["name"], "namespace": "default", "uid": f"other-{i}"}
            status = {"allocation": {"devices": {"results": results}}}
            claims.append({"metadata": meta, "spec": {"devices": {}}, "status": status})
        return claims

    def taint_rules(self) -> list[Obj]:
        rules = []
        for i, rule in enumerate(self.raw.get("taintRules") or []):
            fields = ("driver", "pool", "device", "deviceClassName", "selectors")
            selector = {k: rule[k] for k in fields if k in rule}
            taint = {"key": rule["key"], "effect": rule.get("effect", "NoSchedule")}
            if "value" in rule:
                taint["value"] = rule["value"]
            name = rule.get("name", f"rule-{i}")
            rules.append(
                {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": taint}}
            )
        return rules


_DEFAULT_CLASSES: dict[str, Any] = {
    "npu": f'device.attributes["{DRIVER}"].type == "npu"',
    "gpu": f'device.attributes["{DRIVER}"].type == "gpu"',
    "any": None,
}


def _attribute(value: Any) -> Obj:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, list):
        kind = "ints" if value and isinstance(value[0], int) else "strings"
        return {kind: value}
    text = str(value)
    return {"version": text[2:]} if text.startswith("v:") else {"string": text}


def _device(raw: Obj) -> Obj:
    device: Obj = {"name": raw["name"]}
    if raw.get("attrs"):
        device["attributes"] = {k: _attribute(v) for k, v in raw["attrs"].items()}
    if raw.get("cap"):
        device["capacity"] = {
            k: v if isinstance(v, dict) else {"value": str(v)} for k, v in raw["cap"].items()
        }
    if raw.get("taints"):
        device["taints"] = [{"effect": "NoSchedule", **t} for t in raw["taints"]]
    if raw.get("shared"):
        device["allowMultipleAllocations"] = True
    if raw.get("consumes"):
        device["consumesCounters"] = [
            {"counterSet": s, "counters": {c: {"value": str(v)} for c, v in cs.items()}}
            for s, cs in raw["consumes"].items()
        ]
    for key in ("nodeName", "allNodes"):
        if key in raw:
            device[key] = raw[key]
    if raw.get("bindingConditions"):
        device["bindingConditions"] = raw["bindingConditions"]
    return device


def _request(raw: Obj) -> Obj:
    if "exactly" in raw or "firstAvailable" in raw:
        return raw
    if "alternatives" in raw:
        return {
            "name": raw["name"],
            "firstAvailable": [_exactly(a) | {"name": a["name"]} for a in raw["alternatives"]],
        }
    return {"name": raw["name"], "exactly": _exactly(raw)}


def _exactly(raw: Obj) -> Obj:
    exactly: Obj = {"deviceClassName": raw.get("class", "npu")}
    if raw.get("mode") == "All":
        exactly["allocationMode"] = "All"
    else:
        exactly["allocationMode"] = "ExactCount"
        exactly["count"] = raw.get("count", 1)
    cel = raw.get("cel")
    if cel:
        exactly["selectors"] = [
            {"cel": {"expression": e}} for e in ([cel] if isinstance(cel, str) else cel)
        ]
    if raw.get("admin"):
        exactly["adminAccess"] = True
    if raw.get("tolerations"):
        exactly["tolerations"] = raw["tolerations"]
    if raw.get("capacity"):
        exactly["capacity"] = {"requests": {k: str(v) for k, v in raw["capacity"].items()}}
    return exactly


def load() -> list[Scenario]:
    scenarios = []
    for path in sorted(CORPUS.glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        if "scenarios" not in document:
            continue  # deploy_examples.yaml: read by test_deploy_examples
        defaults = {k: v for k, v in document.items() if k != "scenarios"}
        for raw in document["scenarios"]:
            scenarios.append(Scenario(raw, defaults, source=path.stem))
    return scenarios
