"""A fixed set of 50 JSON schemas for structured outputs (issue 24's validity set): objects of 2-5
properties drawn in turn from the field kinds below (strings, enums, integers, numbers, booleans,
string formats and patterns, nullable and constant values, arrays, nested objects, `$ref`s),
some of them optional. Every string, array and number is bounded (maxLength, maxItems, ranges,
formats of fixed shape), as extraction schemas are: at temperature 1 an unbounded string may
outgrow any max_tokens, and a cut answer is invalid whatever the grammar engine does."""

from __future__ import annotations

from typing import Any

ADDRESS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
           "required": ["city", "zip"], "additionalProperties": False}
FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("name", {"type": "string", "maxLength": 12}),
    ("colour", {"enum": ["red", "green", "blue"]}),
    ("count", {"type": "integer", "minimum": 0, "maximum": 100}),
    ("active", {"type": "boolean"}),
    ("born", {"type": "string", "format": "date"}),
    ("id", {"type": "string", "format": "uuid"}),
    ("tags", {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}),
    ("address", ADDRESS),
    ("code", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}),
    ("nickname", {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "null"}]}),
    ("version", {"const": "v1"}),
    ("host", {"type": "string", "format": "ipv4"}),
    ("score", {"type": "integer", "minimum": -50, "maximum": 50}),
    ("level", {"enum": [1, 2, 3, "max"]}),
    ("points", {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1,
                "maxItems": 4}),
    ("owner", {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                "address": ADDRESS},
               "required": ["name"], "additionalProperties": False}),
    ("at", {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}),
    ("ratio", {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}),
]


def _schema(index: int) -> dict[str, Any]:
    size = 2 + index % 4
    picked = [FIELDS[(index * 7 + step * 5) % len(FIELDS)] for step in range(size)]
    properties = dict(picked)
    required = list(properties) if index % 3 else list(properties)[: max(1, len(properties) - 1)]
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required,
                              "additionalProperties": False}
    if index % 10 == 9:  # the same shape through a $ref
        return {"$defs": {"item": schema}, "type": "object", "properties": {"item": {"$ref": "#/$defs/item"}},
                "required": ["item"], "additionalProperties": False}
    if index % 10 == 4:  # a list of them
        return {"type": "object", "properties": {"items": {"type": "array", "items": schema, "minItems": 1,
                                                           "maxItems": 2}},
                "required": ["items"], "additionalProperties": False}
    return schema


SCHEMAS = [_schema(index) for index in range(50)]
