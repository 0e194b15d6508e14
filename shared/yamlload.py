"""YAML documents parsed safely, through libyaml where PyYAML was built with it.

PyYAML's wheels carry libyaml; its pure-Python parser is about ten times slower, most of all
on long scalars such as a kubeconfig's base64 certificates, which every agent reads at start.
Both raise the same `yaml.YAMLError` kinds, with the same marks.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["load", "load_all"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    """The one document in `text`, as `yaml.safe_load` reads it."""
    return yaml.load(text, Loader=_LOADER)  # a safe loader, C or Python


def load_all(text: str) -> list[Any]:
    """Every document in `text`, as `yaml.safe_load_all` reads them."""
    return list(yaml.load_all(text, Loader=_LOADER))  # a safe loader
