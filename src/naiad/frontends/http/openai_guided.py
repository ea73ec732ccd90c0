"""Structured outputs on the OpenAI endpoints: `response_format` (OpenAI's `json_object` and
`json_schema`) and vLLM's `guided_json`, `guided_regex`, `guided_choice` and `guided_grammar`,
checked for their shapes here and passed to the llm backend as its request parameters of the
same names (the engine compiles the grammar: one it cannot use is a 400 from there)."""

from __future__ import annotations

import json
from typing import Any

from naiad.errors import InvalidArgument

#: vLLM's guided decoding fields, on both endpoints (as vLLM)
GUIDED_FIELDS = frozenset({"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar"})


def guided_parameters(body: dict[str, Any]) -> dict[str, Any]:
    """The backend parameters for the request's structured output ({} when it asks for none)."""
    given = {key: body[key] for key in sorted(GUIDED_FIELDS) if body.get(key) is not None}
    if given.get("response_format") in ({"type": "text"}, {"type": "text", "text": None}):
        del given["response_format"]
    if len(given) > 1:
        raise InvalidArgument(f"at most one of {', '.join(sorted(GUIDED_FIELDS))} may be given, "
                              f"got {', '.join(given)}")
    if not given:
        return {}
    (key, value), = given.items()
    if key == "response_format":
        return _response_format(value)
    if key == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidArgument("'guided_json' must be a JSON schema (an object, or its JSON text)") from None
        if not isinstance(value, dict) or not value:
            raise InvalidArgument("'guided_json' must be a JSON schema (a non-empty object)")
        return {"guided_json": json.dumps(value)}
    if key == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidArgument("'guided_choice' must be a non-empty array of non-empty strings")
        return {"guided_choice": json.dumps(value)}
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"'{key}' must be a non-empty string")
    return {key: value}


def _response_format(value: Any) -> dict[str, Any]:
    """OpenAI's response_format: {"type": "json_object"}, or {"type": "json_schema",
    "json_schema": {"name", "schema", "strict", "description"}}."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidArgument("'response_format' must be an object with a 'type'")
    kind = value["type"]
    if kind == "json_object":
        if set(value) != {"type"}:
            raise InvalidArgument("'response_format' of type json_object takes no other field")
        return {"guided_json_object": True}
    if kind != "json_schema":
        raise InvalidArgument(f"'response_format.type' must be text, json_object or json_schema, got {kind!r}")
    spec = value.get("json_schema")
    if set(value) != {"type", "json_schema"} or not isinstance(spec, dict):
        raise InvalidArgument("'response_format' of type json_schema needs a 'json_schema' object")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise InvalidArgument(f"'response_format.json_schema' has unknown field(s): {', '.join(sorted(unknown))}")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise InvalidArgument("'response_format.json_schema.name' must be a non-empty string")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise InvalidArgument("'response_format.json_schema.strict' must be true or false")
    schema = spec.get("schema", {})  # OpenAI's default: any JSON object
    if not isinstance(schema, dict):
        raise InvalidArgument("'response_format.json_schema.schema' must be a JSON schema (an object)")
    return {"guided_json": json.dumps(schema or {"type": "object"})}
