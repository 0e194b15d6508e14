"""The Grafana dashboard: valid PromQL over metrics the agents export, importable anywhere.

Importable into another Grafana means no hard-coded datasource (a `datasource` variable) and a
`node` variable fed by `target_info`, the series every agent's resource exports. A latency panel
shows the histogram's exemplars; the queries that the Tempo datasource links a span to
(`tracesToMetrics` in the compose stack's datasources) are held to the dashboard's rules.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DASHBOARDS = sorted((REPO / "deploy/compose/grafana/dashboards").glob("*.json"))
DATASOURCES = REPO / "deploy/compose/grafana/provisioning/datasources/datasources.yaml"

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


def test_latency_panels_show_the_histograms_exemplars_once(dashboard: Path) -> None:
    # Exemplars sit on the histograms' buckets; one target per panel asks for them, so that
    # two quantiles of one histogram do not draw each exemplar twice.
    shown = 0
    for panel in _load(dashboard)["panels"]:
        buckets = [
            t for t in panel["targets"] if re.search(r"\bdra_\w+_seconds_bucket\b", t["expr"])
        ]
        exemplars = [t for t in panel["targets"] if t.get("exemplar")]
        assert all(t in buckets for t in exemplars), panel["title"]
        if buckets:
            assert len(exemplars) == 1, panel["title"]
        shown += len(exemplars)
    assert shown, "no panel shows exemplars"


def _traces_to_metrics() -> list[Any]:
    (tempo,) = [
        source
        for source in yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
        if source["type"] == "tempo"
    ]
    queries = tempo["jsonData"]["tracesToMetrics"]["queries"]
    return [pytest.param(query["query"], id=query["name"]) for query in queries]


@pytest.mark.parametrize("expr", _traces_to_metrics())
def test_a_spans_metrics_queries_are_valid_promql_over_exported_metrics(expr: str) -> None:
    # `$$__tags`: Grafana's `$__tags` (the span's tags as matchers, none or more), its `$`
    # escaped from the provisioning file's environment expansion.
    assert "$" not in expr.replace("$$__tags", ""), expr
    for tags in ("", 'k8s_node_name="node-a"'):
        promql_parser.parse(expr.replace("$$__tags", tags))
    used = {_instrument_of(series) for series in re.findall(r"\bdra_[a-z_]+", expr)}
    assert used, expr
    assert used <= _instruments_in_code(), sorted(used - _instruments_in_code())
    assert 'target_info{service_namespace="dra-suite", $$__tags}' in expr
