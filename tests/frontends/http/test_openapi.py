"""The OpenAPI document served at /openapi.json against the routes and handlers it describes."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from naiad.frontends.http.handlers import HANDLERS
from naiad.frontends.http.routes import match

# Served but not described, as the document's description says.
UNDESCRIBED = {"model_generate_stream", "cuda_register", "cuda_unregister",
               "openai_models", "openai_completions", "openai_chat_completions", "openai_embeddings",
               "openai_rerank", "openai_score", "openai_tokenize", "openai_detokenize"}
SAMPLE = {"model_name": "simple", "model_version": "2", "region_name": "r1"}


def _document() -> dict[str, Any]:
    return json.loads(resources.files("naiad.frontends.http").joinpath("openapi.json").read_text())


def test_document_is_openapi_3() -> None:
    document = _document()
    assert document["openapi"].startswith("3.0.")
    assert {"title", "version", "description"} <= set(document["info"])


def test_every_described_operation_has_a_handler() -> None:
    for path, item in _document()["paths"].items():
        concrete = re.sub(r"\{(\w+)\}", lambda found: SAMPLE[found[1]], path)
        route = match(concrete)
        assert route is not None, path
        for method in item:
            assert (route.action, method.upper()) in HANDLERS, (method, path)


def test_every_handler_is_described_or_listed_as_not() -> None:
    described = set()
    for path, item in _document()["paths"].items():
        route = match(re.sub(r"\{(\w+)\}", lambda found: SAMPLE[found[1]], path))
        assert route is not None
        described |= {(route.action, method.upper()) for method in item}
    missing = {key for key in HANDLERS if key not in described and key[0] not in UNDESCRIBED}
    assert not missing


def test_every_reference_resolves() -> None:
    document = _document()
    text = json.dumps(document)
    for pointer in set(re.findall(r'"\$ref": "#/([^"]+)"', text)):
        node: Any = document
        for part in pointer.split("/"):
            node = node[part]
