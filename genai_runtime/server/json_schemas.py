"""JSON-schema rewrites the server makes before a schema becomes a grammar.

``closed``: every object that lists its properties, and says nothing of others, allows no others
(OpenAI's strict mode; small models otherwise go on inventing keys). ``rerooted``: a schema moved
inside another keeps its local ``$ref``s pointing at its own parts.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value is one subschema / a list of them / a map of them, walked by ``closed``.
# allOf is left alone: closing one branch of an intersection can make the whole unsatisfiable.
_ONE = ("items", "additionalItems", "not", "if", "then", "else", "contains")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists ``properties`` and says nothing of others
    (``additionalProperties``, ``patternProperties``) allowing no others, in its properties,
    items, alternatives and definitions alike: what it accepts is a subset of what ``schema``
    accepts."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            out[key] = closed(schema[key])
    for key in _LIST:
        if isinstance(schema.get(key), list):
            out[key] = [closed(s) for s in schema[key]]
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            out[key] = {k: closed(v) for k, v in schema[key].items()}
    if isinstance(schema.get("properties"), dict) and not (
        "additionalProperties" in schema or "patternProperties" in schema
    ):
        out["additionalProperties"] = False
    return out


def rerooted(schema: Any, at: str) -> Any:
    """``schema`` as it reads placed at JSON pointer ``at`` (``#/properties/arguments``) of
    another: each local ``$ref`` (``#``, ``#/$defs/X``, ``#/properties/y``) gets ``at`` in front,
    so a tool's own definitions still resolve inside the call wrapper."""
    if isinstance(schema, list):
        return [rerooted(s, at) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = at + value[1:]
        elif key in ("const", "enum", "default", "examples"):
            out[key] = value  # data, not schemas
        else:
            out[key] = rerooted(value, at)
    return out
