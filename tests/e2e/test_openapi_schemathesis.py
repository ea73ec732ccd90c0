"""schemathesis against a live `naiad serve` on the example repository: every operation in the
OpenAPI document naiad serves at /openapi.json is called with data that fits the document (its
own examples, then generated cases), and every answer must be a non-5xx response whose status,
content type and body the document allows.

Positive data only: naiad answers some schema-violating JSON with 500 on purpose, as Triton does
(a negative shape dim, a shared-memory parameter of the wrong type), so negative cases would
report Triton's behaviour rather than naiad's bugs. Bounded for CI by _MAX_EXAMPLES per operation.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from conftest import ServerProcess, running_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.e2e

_MAX_EXAMPLES = 25
_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Small models that load in about a second; the document's examples infer on `simple`.
_MODELS = ["simple", "simple_string", "identity"]
# The one 5xx a schema-valid request may get: Triton answers a key that names no shared-memory
# object with INTERNAL (500), and naiad keeps its status and text (core/shared_memory.py).
_TRITON_500 = {("POST", "/v2/systemsharedmemory/region/{region_name}/register"): "Unable to open shared memory region"}
# No region is registered (no generated key names a shared-memory object), so these never succeed.
_NO_SUCCESS = {("GET", "/v2/systemsharedmemory/region/{region_name}/status"), *_TRITON_500}
# One test per operation, listed from the packaged document (the live server serves this file).
_DOCUMENT = json.loads(resources.files("naiad.frontends.http").joinpath("openapi.json").read_text())
_OPERATIONS = [(method.upper(), path) for path, item in _DOCUMENT["paths"].items() for method in item]


@pytest.fixture(scope="module")
def openapi_server(example_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(example_repo), "--model-control-mode", "explicit",
            "--allow-client-shm", "true"]
    for model in _MODELS:
        args += ["--load-model", model]
    with running_server(args, tmp_path_factory.mktemp("openapi") / "naiad.log") as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(openapi_server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"http://{openapi_server.url}/openapi.json")


def test_openapi_document_is_served(openapi_server: ServerProcess) -> None:
    with urllib.request.urlopen(f"http://{openapi_server.url}/openapi.json", timeout=5) as response:
        assert response.headers["content-type"] == "application/json"
        assert json.load(response) == _DOCUMENT


# schemathesis' own pytest plugin (schema.parametrize) fails on pytest 9 (it reads a private
# `_nodeid`), so each operation's cases are driven here with hypothesis directly.
_SETTINGS = settings(max_examples=_MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize(("method", "path"), _OPERATIONS, ids=[f"{m} {p}" for m, p in _OPERATIONS])
def test_operation_conforms_to_the_document(method: str, path: str, api_schema: Any) -> None:
    operation = api_schema[path][method]
    checks = _CHECKS
    if (method, path) in _TRITON_500:
        checks = [check for check in _CHECKS if check is not not_a_server_error]

    statuses: set[int] = set()

    def call(case: Any) -> None:
        response = case.call_and_validate(checks=checks)
        statuses.add(response.status_code)
        if response.status_code >= 500:
            assert response.json()["error"].startswith(_TRITON_500[(method, path)]), response.text

    examples = operation.get_strategies_from_examples()
    if examples:  # the document's own examples first, then generated cases
        given(st.one_of(examples))(_SETTINGS(lambda case: call(case)))()
    given(operation.as_strategy(GenerationMode.POSITIVE))(_SETTINGS(lambda case: call(case)))()
    # The examples reach the example models: every operation succeeds at least once.
    assert any(200 <= status < 300 for status in statuses) or (method, path) in _NO_SUCCESS, statuses
