"""The JSON Schema of matrix.yaml, generated from the typed settings for editors."""

from __future__ import annotations

import json

from .config import Matrix

SCHEMA_ID = "https://json-schema.org/draft/2020-12/schema"


def render() -> str:
    schema = Matrix.model_json_schema(by_alias=True)
    schema = {"$schema": SCHEMA_ID, "title": "extmatrix matrix.yaml", **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
