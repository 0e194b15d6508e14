"""The Grafana dashboard: valid PromQL over metrics the agents export, importable anywhere.

Importable into another Grafana means no hard-coded datasource (a `datasource` variable) and a
`node` variable fed by `target_info`, the series every agent's resource exports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((REPO / "deploy/compose/grafana/dashboards").glob("*.json"))

_INSTRUMENT = re.compile(
    r'create_(?:counter|histogram|observable_gauge|up_down_counter|gauge)\(\s*"(dra_[a-z_]+)"'
)
_SERIES_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _instruments_in_code() -> set[str]:
    names: set[str] = set()
    for path in [*(REPO / "services").rglob("*.py"), *(REPO / "shared").rglob("*.py")]:
        names |= set(_INSTRUMENT.findall(path.read_text(encoding="utf-8")))
    return names


def _instrument_of(series: str) -> str:
    for suffix in _SERIES_SUFFIXES:
        series = series.removesuffix(suffix)
    return series.removesuffix("_seconds")


def _load(dashboard: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(dashboard.read_text(encoding="utf-8"))
    return loaded


def _expressions(dashboard: Path) -> list[str]:
    return [target["expr"] for panel in _load(dashboard)["panels"] for target in panel["targets"]]


@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def dashboard(request: pytest.FixtureRequest) -> Path:
    path: Path = request.param
    return path


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS


def test_dashboard_queries_only_metrics_the_agents_export(dashboard: Path) -> None:
    used = {
        _instrument_of(series)
        for expr in _expressions(dashboard)
        for series in re.findall(r"\bdra_[a-z_]+", expr)
    }
    assert used, "a dashboard without dra-suite metrics"
    assert used <= _instruments_in_code(), sorted(used - _instruments_in_code())


def test_every_query_is_valid_promql(dashboard: Path) -> None:
    for expr in _expressions(dashboard):
        promql_parser.parse(expr.replace("$node", ".*"))  # raises on a syntax error


def test_every_query_filters_by_the_node_variable(dashboard: Path) -> None:
    for expr in _expressions(dashboard):
        assert 'target_info{k8s_node_name=~"$node"}' in expr, expr


def test_panels_use_the_datasource_variable_not_a_fixed_uid(dashboard: Path) -> None:
    for panel in _load(dashboard)["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"])["uid"] == "${datasource}"


def test_dashboard_declares_datasource_and_node_variables(dashboard: Path) -> None:
    variables = {v["name"]: v for v in _load(dashboard)["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    node = variables["node"]
    assert node["datasource"]["uid"] == "${datasource}"
    assert "k8s_node_name" in node["query"]["query"]
    assert node["includeAll"]
    assert node["allValue"] == ".*"


def test_api_server_errors_count_failures_and_throttling_not_normal_answers(
    dashboard: Path,
) -> None:
    error_queries = [
        expr for expr in _expressions(dashboard) if "code=~" in expr and "dra_kube_requests" in expr
    ]
    assert error_queries
    for expr in error_queries:
        codes = re.search(r'code=~"([^"]+)"', expr)
        assert codes is not None
        pattern = re.compile(f"^(?:{codes.group(1)})$")
        assert all(pattern.match(c) for c in ("500", "503", "429"))
        assert not any(pattern.match(c) for c in ("404", "409", "200", "201"))
