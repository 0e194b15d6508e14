"""The vendored CDI JSON schema: it loads, accepts what runtimes load, rejects what they do not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.schema_check import SCHEMA_DIR, schema_problems
from services.allocation.cdi.spec_files import CDIDevice

DRIVER = "sim.dra-suite.io"


def _spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": "k8s.sim.dra-suite.io/claim",
        "devices": [{"name": "dev-a", "containerEdits": {"env": ["A=1"]}}],
    }
    spec.update(changes)
    return spec


def _edits(**edits: Any) -> dict[str, Any]:
    return _spec(devices=[{"name": "dev-a", "containerEdits": edits}])


def test_the_schema_files_are_json_with_the_upstream_layout():
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    assert schema["required"] == ["cdiVersion", "kind", "devices"]
    assert {"containerEdits", "DeviceNode", "Mount", "Hook"} <= set(defs["definitions"])


@pytest.mark.parametrize(
    "spec",
    [
        _spec(),
        _spec(containerEdits={"deviceNodes": [{"path": "/dev/ctl"}]}),
        _spec(annotations={"a": "b"}),
        _edits(deviceNodes=[{"path": "/dev/x", "hostPath": "/dev/null", "permissions": "rw"}]),
        _edits(mounts=[{"hostPath": "/a", "containerPath": "/b", "options": ["ro"]}]),
        _edits(hooks=[{"hookName": "createContainer", "path": "/bin/hook", "timeout": 5}]),
        _edits(additionalGids=[44], netDevices=[{"hostInterfaceName": "eth1", "name": "net0"}]),
    ],
    ids=[
        "minimal",
        "spec-level-edits",
        "annotations",
        "device-node-host-path",
        "mount-options",
        "hook",
        "gids-and-net-devices",
    ],
)
def test_specs_runtimes_load_conform(spec):
    assert schema_problems(spec) == []


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"kind": "a/b", "devices": []}, "$"),
        (_spec(devices=[{"name": "dev-a"}]), "$.devices[0]"),
        (_spec(extra=1), "$"),
        (_spec(devices=[{"name": "d", "containerEdits": {}, "color": "red"}]), "$.devices[0]"),
        (_edits(env=["A=1", 2]), "$.devices[0].containerEdits.env[1]"),
        (
            _edits(deviceNodes=[{"hostPath": "/dev/x"}]),
            "$.devices[0].containerEdits.deviceNodes[0]",
        ),
        (
            _edits(deviceNodes=[{"path": "/dev/x", "mode": 1}]),
            "$.devices[0].containerEdits.deviceNodes[0]",
        ),
        (_edits(mounts=[{"hostPath": "/a"}]), "$.devices[0].containerEdits.mounts[0]"),
        (
            _edits(hooks=[{"hookName": "x", "path": "/h", "timeout": -1}]),
            "$.devices[0].containerEdits.hooks[0].timeout",
        ),
        (_edits(devices=[]), "$.devices[0].containerEdits"),
        (_spec(cdiVersion=1), "$.cdiVersion"),
        (_spec(annotations={"a": 1}), "$.annotations.a"),
    ],
    ids=[
        "no-cdi-version",
        "device-without-edits",
        "unknown-top-field",
        "unknown-device-field",
        "env-not-string",
        "device-node-without-path",
        "unknown-device-node-field",
        "mount-without-container-path",
        "negative-hook-timeout",
        "unknown-edit-field",
        "version-not-string",
        "annotation-not-string",
    ],
)
def test_the_schema_names_what_it_rejects(spec, where):
    problems = schema_problems(spec)
    assert problems
    assert any(problem.startswith(f"{where}:") for problem in problems), problems


def test_validate_reports_schema_problems_with_its_own():
    spec = spec_files.build_spec(driver=DRIVER, devices=[CDIDevice(name="dev-a", env={"A": "1"})])
    spec["devices"][0]["containerEdits"]["color"] = "red"
    spec["devices"].append({"name": "bad_", "containerEdits": {"env": ["B=2"]}})
    problems = spec_files.validate(spec)
    assert any("'color' was unexpected" in problem for problem in problems)
    assert "device name 'bad_' is invalid" in problems


def test_a_remembered_valid_shape_never_hides_a_changed_structure():
    assert schema_problems(_spec()) == []
    assert schema_problems(_edits(env=["A=1"], deviceNodes=[{"path": "/dev/x"}])) == []
    assert schema_problems(_edits(env=["A=1"], deviceNodes=[{"path": 7}])) != []
    assert schema_problems(_edits(env=["A=1", "B=2"], deviceNodes=[{"path": "/dev/x", "uid": -1}]))
