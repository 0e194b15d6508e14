"""The metric table of docs/operations.md lists every instrument the agents create."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_INSTRUMENT = re.compile(
    r'create_(?:counter|histogram|observable_gauge|up_down_counter|gauge)\(\s*"(dra_[a-z_]+)"'
)


def _instruments_in_code() -> set[str]:
    names: set[str] = set()
    for path in [*(REPO / "services").rglob("*.py"), *(REPO / "shared").rglob("*.py")]:
        names |= set(_INSTRUMENT.findall(path.read_text(encoding="utf-8")))
    return names


def test_every_instrument_is_in_the_readme_metric_table() -> None:
    readme = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(dra_[a-z_]+)`", readme))
    # Prometheus names add the unit and the counter suffix to the instrument's name.
    missing = {
        name
        for name in _instruments_in_code()
        if not any(d == name or d.startswith(f"{name}_") for d in documented)
    }
    assert not missing, sorted(missing)
