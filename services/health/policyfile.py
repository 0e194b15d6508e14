"""The optional YAML policy file (`--policy-file`) read into `FaultRules`.

An empty path gives the built-in rules. The file's keys are those of `rules.from_mapping`;
a missing, unreadable or invalid file raises ConfigError, so the agent exits 2 at start.
The flags give the base the file overrides (`--taint-effect`, `--ascend-unknown-codes`),
except `--additional-xids-to-ignore`, added to the XID ignore list after the file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml

from services.health.rules import FaultRules, default_rules, from_mapping, ignoring
from shared import yamlload
from shared.errors import ConfigError

__all__ = ["load"]


def load(
    path: str,
    *,
    effect: str,
    ascend_unknown_codes: str = "isolate",
    extra_ignored_xids: Iterable[str] = (),
) -> FaultRules:
    """The rules of the file at `path` over the defaults (`effect` for fatal and transient),
    with `extra_ignored_xids` added to the XID ignore list."""
    base = default_rules(effect=effect, ascend_unknown_codes=ascend_unknown_codes)
    extra = [str(int(xid)) for xid in extra_ignored_xids]  # "048" is XID 48
    return ignoring(_read(path, base), "xid", extra)


def _read(path: str, base: FaultRules) -> FaultRules:
    if not path:
        return base
    try:
        document = yamlload.load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"policy file {path}: {exc.strerror}", field="policy_file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"policy file {path}: not YAML: {_where(exc)}", field="policy_file"
        ) from exc
    return from_mapping(document, base=base)


def _where(exc: yaml.YAMLError) -> str:
    """The parser's complaint on one line: `expected ',' or ']' (line 2, column 1)`."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return (
        problem if mark is None else f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    )
