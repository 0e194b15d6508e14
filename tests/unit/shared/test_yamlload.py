"""`shared.yamlload` reads what `yaml.safe_load` reads, and fails where it fails, with the
same kind of error at the same place (libyaml words some problems differently)."""

from __future__ import annotations

import pytest
import yaml

from shared import yamlload

_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", certificate-authority-data: TUlJQmtUQ0NBVGVn}
users:
- name: u
  user: {token: abc, flags: [yes, no, ~, 0o17, 1e3, "2026-11-27"]}
when: 2026-11-27
"""


def test_libyaml_is_in_use_where_pyyaml_has_it() -> None:
    assert yaml.__with_libyaml__, "PyYAML's wheels carry libyaml"
    assert yamlload._LOADER.__name__ == "CSafeLoader"


def test_a_document_reads_as_safe_load_reads_it() -> None:
    assert yamlload.load(_KUBECONFIG) == yaml.safe_load(_KUBECONFIG)
    assert yamlload.load_all(f"{_KUBECONFIG}---\na: 1\n") == list(
        yaml.safe_load_all(f"{_KUBECONFIG}---\na: 1\n")
    )


@pytest.mark.parametrize(
    "text", ["a: [1, 2\n", "a: b: c\n", "- a\nb: 1\n", "a: !!python/tuple [1]\n"]
)
def test_bad_yaml_fails_as_safe_load_fails_at_the_same_place(text: str) -> None:
    with pytest.raises(yaml.YAMLError) as ours:
        yamlload.load(text)
    with pytest.raises(yaml.YAMLError) as pure:
        yaml.safe_load(text)
    assert type(ours.value) is type(pure.value)
    assert isinstance(ours.value, yaml.MarkedYAMLError)
    assert isinstance(pure.value, yaml.MarkedYAMLError)
    assert ours.value.problem
    assert ours.value.problem_mark is not None
    assert pure.value.problem_mark is not None
    assert (ours.value.problem_mark.line, ours.value.problem_mark.column) == (
        pure.value.problem_mark.line,
        pure.value.problem_mark.column,
    )
