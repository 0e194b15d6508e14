"""The CDI JSON schema (`schema/schema.json` + `defs.json`) as a validator (pure).

`schema_problems(spec)` lists what the schema rejects in a spec, each as `<json path>: <why>`;
`cdi.validate` adds them to its own checks (names, versions, empty edits), which the schema
does not express. The schema is loaded once, on first use.

jsonschema takes ~0.4 ms for a claim's spec, too much for every prepare. The schema constrains
only structure (keys, types, integer ranges), never the content of a string, so a spec is
valid exactly when its skeleton (every string emptied, identical list items merged) is: the
validity of recent skeletons is cached, and only a new shape is validated in full.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

__all__ = ["SCHEMA_DIR", "schema_problems"]

SCHEMA_DIR = Path(__file__).with_name("schema")


@functools.cache
def _validator() -> Draft7Validator:
    documents = {
        name: json.loads((SCHEMA_DIR / name).read_text()) for name in ("schema.json", "defs.json")
    }
    registry: Registry[Any] = Registry().with_resources(
        (name, Resource.from_contents(document, default_specification=DRAFT7))
        for name, document in documents.items()
    )
    return Draft7Validator(documents["schema.json"], registry=registry)


def schema_problems(spec: Mapping[str, Any]) -> list[str]:
    """What the CDI schema rejects in `spec`; an empty list means it conforms."""
    if _shape_is_valid(json.dumps(_skeleton(spec), sort_keys=True)):
        return []
    errors = sorted(_validator().iter_errors(spec), key=lambda e: list(e.absolute_path))
    return [f"{e.json_path}: {e.message}" for e in errors]


@functools.lru_cache(maxsize=1024)
def _shape_is_valid(shape: str) -> bool:
    return bool(_validator().is_valid(json.loads(shape)))


def _skeleton(value: Any) -> Any:
    """`value` with every string emptied and identical list items merged (same validity)."""
    if isinstance(value, str):
        return ""
    if isinstance(value, Mapping):
        return {str(key): _skeleton(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = {json.dumps(_skeleton(item), sort_keys=True) for item in value}
        return [json.loads(item) for item in sorted(items)]
    return value
