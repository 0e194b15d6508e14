"""Fault rules: classification by cause and code, ignore lists, and the policy file."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.health import policyfile, rules
from services.health.rules import ClassRule, FaultClass, FaultRules, classify, default_rules
from shared.errors import ConfigError
from shared.vendors import nvidia, registry

DEFAULT = default_rules()


@pytest.mark.parametrize(
    ("cause", "code", "expected"),
    [
        ("xid", "79", FaultClass.FATAL),
        ("xid", "48", FaultClass.FATAL),
        *[("xid", xid, None) for xid in nvidia.APPLICATION_XIDS],
        ("xid", "94", FaultClass.TRANSIENT),
        ("xid", "92", FaultClass.TRANSIENT),
        ("ecc", "13", FaultClass.FATAL),
        ("gpu-lost", "", FaultClass.FATAL),
        ("unmonitored", "", FaultClass.FATAL),
        ("injected", "", FaultClass.FATAL),
        ("npu", "80E3A201", FaultClass.FATAL),
        ("npu-restart", "8C03A000", FaultClass.TRANSIENT),
        ("npu-subhealth", "81A3880C", FaultClass.INFORMATIONAL),
    ],
    ids=[
        "fatal xid",
        "double-bit ecc xid",
        *[f"application xid {xid} is ignored" for xid in nvidia.APPLICATION_XIDS],
        "contained ecc xid is transient",
        "high single-bit ecc rate is transient",
        "ignore list is per cause",
        "gpu lost is fatal",
        "unmonitored is fatal",
        "injected is fatal",
        "npu separate level is fatal",
        "npu restart level is transient",
        "npu sub-health is informational",
    ],
)
def test_default_rules_classify_faults(cause, code, expected):
    assert classify(cause=cause, code=code, rules=DEFAULT) is expected


def test_default_classes_have_their_effects():
    assert DEFAULT.rule(FaultClass.FATAL) == ClassRule(effect="NoSchedule")
    assert DEFAULT.rule(FaultClass.TRANSIENT) == ClassRule(effect="NoSchedule")
    assert DEFAULT.rule(FaultClass.INFORMATIONAL) == ClassRule(effect="None", unhealthy=False)
    assert default_rules(effect="NoExecute").rule(FaultClass.FATAL).effect == "NoExecute"
    assert default_rules(effect="NoExecute").rule(FaultClass.INFORMATIONAL).effect == "None"


DOCUMENT = {
    "classes": {"fatal": {"effect": "NoExecute"}, "transient": {"unhealthy": False}},
    "causes": {"ecc": "transient"},
    "codes": {"xid": {79: "informational"}},
    "ignore": {"xid": [999]},
    "default": "transient",
}


@pytest.mark.parametrize(
    ("cause", "code", "expected"),
    [
        ("xid", "79", FaultClass.INFORMATIONAL),
        ("xid", "13", FaultClass.TRANSIENT),
        ("xid", "999", None),
        ("xid", "94", FaultClass.TRANSIENT),
        ("ecc", "", FaultClass.TRANSIENT),
        ("something-new", "", FaultClass.TRANSIENT),
    ],
    ids=[
        "a code rule wins over the cause",
        "a replaced ignore list no longer ignores the old codes (default class)",
        "the new ignore list applies",
        "built-in code rules are kept",
        "a cause rule applies",
        "the default class applies to unknown causes",
    ],
)
def test_a_policy_document_overrides_the_defaults(cause, code, expected):
    custom = rules.from_mapping(DOCUMENT, base=DEFAULT)
    assert classify(cause=cause, code=code, rules=custom) is expected


def test_a_policy_document_sets_class_effects_and_health():
    custom = rules.from_mapping(DOCUMENT, base=DEFAULT)
    assert custom.rule(FaultClass.FATAL) == ClassRule(effect="NoExecute")
    assert custom.rule(FaultClass.TRANSIENT) == ClassRule(effect="NoSchedule", unhealthy=False)


@pytest.mark.parametrize(
    "document",
    [
        ["not", "a", "mapping"],
        {"colours": {}},
        {"classes": {"deadly": {"effect": "NoSchedule"}}},
        {"classes": {"fatal": {"effect": "PreferNoSchedule"}}},
        {"classes": {"fatal": {"unhealthy": "yes"}}},
        {"classes": {"fatal": {"colour": "red"}}},
        {"causes": {"xid": "bad"}},
        {"codes": {"xid": ["79"]}},
        {"ignore": {"xid": "13"}},
        {"default": "never"},
        {"ascend_unknown_codes": "panic"},
    ],
    ids=[
        "document is not a mapping",
        "unknown top-level key",
        "unknown class",
        "unknown effect",
        "unhealthy is not a bool",
        "unknown class key",
        "unknown class of a cause",
        "codes of a cause are not a mapping",
        "ignore list is not a list",
        "unknown default class",
        "unknown handling of unknown ascend codes",
    ],
)
def test_invalid_policy_documents_raise_config_error(document):
    with pytest.raises(ConfigError):
        rules.from_mapping(document, base=DEFAULT)


def test_an_empty_policy_document_keeps_the_defaults():
    assert rules.from_mapping(None, base=DEFAULT) == DEFAULT


def test_the_policy_file_is_read_as_yaml(tmp_path: Path):
    path = tmp_path / "policy.yaml"
    path.write_text("classes:\n  fatal: {effect: NoExecute}\nignore:\n  xid: []\n")
    loaded = policyfile.load(str(path), effect="NoSchedule")
    assert loaded.rule(FaultClass.FATAL).effect == "NoExecute"
    assert classify(cause="xid", code="13", rules=loaded) is FaultClass.FATAL


def test_no_policy_file_gives_the_built_in_rules_with_the_flag_effect():
    assert policyfile.load("", effect="NoExecute") == default_rules(effect="NoExecute")


@pytest.mark.parametrize(
    "content",
    [None, "classes: [unclosed", "default: never\n"],
    ids=["missing file", "not yaml", "invalid document"],
)
def test_a_bad_policy_file_raises_config_error(tmp_path: Path, content):
    path = tmp_path / "policy.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError):
        policyfile.load(str(path), effect="NoSchedule")


@pytest.mark.parametrize(
    ("flag", "document", "expected"),
    [
        ("isolate", {}, "isolate"),
        ("ignore", {}, "ignore"),
        ("isolate", {"ascend_unknown_codes": "ignore"}, "ignore"),
        ("ignore", {"ascend_unknown_codes": "isolate"}, "isolate"),
    ],
    ids=["flag isolate", "flag ignore", "file ignores over flag", "file isolates over flag"],
)
def test_unknown_ascend_codes_follow_the_flag_unless_the_document_says(flag, document, expected):
    base = default_rules(ascend_unknown_codes=flag)
    assert rules.from_mapping(document, base=base).ascend_unknown_codes == expected


def test_additional_ignored_xids_join_the_list_the_policy_file_leaves(tmp_path: Path):
    flagged = policyfile.load("", effect="NoSchedule", extra_ignored_xids=("48", "094"))
    assert flagged.ignore["xid"] == frozenset({*nvidia.APPLICATION_XIDS, "48", "94"})
    path = tmp_path / "policy.yaml"
    path.write_text("ignore:\n  xid: [999]\n")
    replaced = policyfile.load(str(path), effect="NoSchedule", extra_ignored_xids=("48",))
    assert replaced.ignore["xid"] == frozenset({"999", "48"})
    assert classify(cause="xid", code="48", rules=replaced) is None
    assert classify(cause="xid", code="13", rules=replaced) is FaultClass.FATAL
    assert policyfile.load(str(path), effect="NoSchedule").ignore["xid"] == frozenset({"999"})


def test_fault_rules_are_immutable():
    with pytest.raises(TypeError):
        FaultRules().causes["x"] = FaultClass.FATAL  # type: ignore[index]


def test_the_built_in_classes_are_the_vendors_own():
    """The rules start from what each vendor package declares, nothing the agent adds."""
    built_in = default_rules()
    for vendor in registry.BACKENDS.values():
        for cause, name in vendor.faults.causes.items():
            assert built_in.causes[cause] is FaultClass(name), (vendor.name, cause)
        for code, name in vendor.faults.codes.items():
            assert built_in.codes[code] is FaultClass(name), (vendor.name, code)
        for cause, codes in vendor.faults.ignore.items():
            assert codes <= built_in.ignore[cause], (vendor.name, cause)
    assert set(built_in.ignore["xid"]) == set(nvidia.APPLICATION_XIDS)
    assert classify(cause="npu-restart", code="", rules=built_in) is FaultClass.TRANSIENT
    assert classify(cause="xid", code="79", rules=built_in) is FaultClass.FATAL
