"""deploy/kserve: the ClusterServingRuntimes and example InferenceServices against our schema of
KServe's objects (tests/deploy/kserve.schema.json), Kubernetes' own Container schema, and
naiad's command-line parser; and deploy/Dockerfile against what the manifests expect of it."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from deploy.tools import (
    CHART,
    KSERVE,
    ROOT,
    container_command,
    load_manifests,
    parse_server_command,
    validate_container,
    validate_core,
)
from naiad.backends.registry import known_backends

SCHEMA = json.loads((Path(__file__).with_name("kserve.schema.json")).read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
KSERVE_KINDS = {"ServingRuntime", "ClusterServingRuntime", "InferenceService"}
MANIFEST_FILES = sorted(KSERVE.glob("*.yaml"))
OBJECTS = [obj for path in MANIFEST_FILES for obj in load_manifests(path)]
RUNTIMES = {obj["metadata"]["name"]: obj for obj in OBJECTS if obj["kind"].endswith("ServingRuntime")}
SERVICES = [obj for obj in OBJECTS if obj["kind"] == "InferenceService"]
# KServe model-format names → the naiad backend that serves them; "triton" is a whole repository.
FORMAT_BACKENDS = {"onnx": "onnxruntime", "pytorch": "pytorch", "tensorflow": "tensorflow",
                   "openvino": "openvino", "tensorrt": "tensorrt", "python": "python", "triton": None}


def _errors(obj: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in VALIDATOR.iter_errors(obj)]


def test_the_examples_cover_http_grpc_s3_and_llm() -> None:
    assert {"naiad", "naiad-llm"} <= set(RUNTIMES)
    uris = [svc["spec"]["predictor"]["model"]["storageUri"] for svc in SERVICES]
    assert any(uri.startswith("s3://") for uri in uris)
    assert any(svc["spec"]["predictor"]["model"].get("ports") for svc in SERVICES)  # the gRPC one
    assert any(svc["spec"]["predictor"]["model"].get("runtime") == "naiad-llm" for svc in SERVICES)


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.name)
def test_manifests_pass_their_schemas(path: Path) -> None:
    for obj in load_manifests(path):
        if obj["kind"] in KSERVE_KINDS:
            assert _errors(obj) == []
            for container in obj["spec"].get("containers", []):
                validate_container(container)  # strict: an unknown container field fails
        else:
            validate_core(obj)


@pytest.mark.parametrize(("edit", "where"), [
    (lambda rt, svc: rt["spec"].update(protocolVersion=["v2"]), "spec"),
    (lambda rt, svc: rt["spec"].update(protocolVersions=["v3"]), "protocolVersions/0"),
    (lambda rt, svc: svc["spec"]["predictor"]["model"].update(storageUri="s3:/bucket"), "storageUri"),
    (lambda rt, svc: svc["spec"]["predictor"]["model"].update(
        ports=[{"name": "grpc", "containerPort": 9000, "protocol": "TCP"}]), "ports/0/name"),
    (lambda rt, svc: svc["spec"]["predictor"].update(modle={}), "predictor"),
])
def test_schema_refuses_typos(edit: Any, where: str) -> None:
    """The schema is not vacuous: each broken copy fails at the field that was broken."""
    runtime, service = copy.deepcopy(RUNTIMES["naiad"]), copy.deepcopy(SERVICES[0])
    edit(runtime, service)
    errors = _errors(runtime) + _errors(service)
    assert errors, "the broken manifest passed"
    # oneOf reports at the object; the nested causes name the field
    causes = [str(error.path) + " " + "/".join(map(str, sub.absolute_path))
              for obj in (runtime, service) for error in VALIDATOR.iter_errors(obj) for sub in error.context or []]
    assert any(where in cause for cause in causes), causes


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_runtime_speaks_v2_and_exposes_metrics(name: str) -> None:
    spec = RUNTIMES[name]["spec"]
    assert {"v2", "grpc-v2"} <= set(spec["protocolVersions"])
    parsed = parse_server_command(*container_command(spec["containers"][0]))
    assert spec["annotations"]["prometheus.kserve.io/port"] == str(parsed.metrics_port)
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_runtime_args_are_flags_naiad_accepts(name: str) -> None:
    container = RUNTIMES[name]["spec"]["containers"][0]
    parsed = parse_server_command(*container_command(container))
    # where KServe's storage initializer puts the model, and KServe's serving ports
    assert parsed.model_repository == ["/mnt/models"]
    assert (parsed.http_port, parsed.grpc_port) == (8080, 9000)
    assert parsed.allow_http and parsed.allow_grpc
    # a pod's default grace period is 30 s and the runtime sets none: drain within it
    assert parsed.exit_timeout_secs < 30


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_runtime_runs_non_root(name: str) -> None:
    security = RUNTIMES[name]["spec"]["containers"][0]["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]


def test_runtime_formats_are_served_by_naiad_backends() -> None:
    backends = set(known_backends())
    for runtime in RUNTIMES.values():
        for model_format in runtime["spec"]["supportedModelFormats"]:
            assert model_format["name"] in FORMAT_BACKENDS, model_format
            backend = FORMAT_BACKENDS[model_format["name"]]
            assert backend is None or backend in backends


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s["metadata"]["name"])
def test_inference_service_names_a_runtime_for_its_format(service: dict[str, Any]) -> None:
    model = service["spec"]["predictor"]["model"]
    runtime = RUNTIMES[model["runtime"]]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats


def test_grpc_service_routes_h2c_to_the_runtime_grpc_port() -> None:
    grpc = [svc for svc in SERVICES if svc["spec"]["predictor"]["model"].get("ports")]
    assert grpc
    for service in grpc:
        model = service["spec"]["predictor"]["model"]
        parsed = parse_server_command(*container_command(RUNTIMES[model["runtime"]]["spec"]["containers"][0]))
        assert model["ports"] == [{"name": "h2c", "protocol": "TCP", "containerPort": parsed.grpc_port}]


def test_s3_service_account_carries_the_credentials_secret() -> None:
    s3 = [svc for svc in SERVICES if svc["spec"]["predictor"]["model"]["storageUri"].startswith("s3://")]
    accounts = {obj["metadata"]["name"]: obj for obj in OBJECTS if obj["kind"] == "ServiceAccount"}
    secrets = {obj["metadata"]["name"]: obj for obj in OBJECTS if obj["kind"] == "Secret"}
    for service in s3:
        account = accounts[service["spec"]["predictor"]["serviceAccountName"]]
        secret = secrets[account["secrets"][0]["name"]]
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(secret["stringData"])
        assert "serving.kserve.io/s3-endpoint" in secret["metadata"]["annotations"]


def test_dockerfile_gives_the_manifests_what_they_expect() -> None:
    """The image runs as the UID the manifests require and ships the `tritonserver` they call."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    user = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    assert user == [("1000", "1000")]
    # no ENTRYPOINT instruction: args: [tritonserver, ...] must run as written
    assert not re.search(r"^ENTRYPOINT", dockerfile, re.MULTILINE)
    uids = {RUNTIMES[name]["spec"]["containers"][0]["securityContext"]["runAsUser"] for name in RUNTIMES}
    uids.add(yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"])
    assert uids == {1000}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tritonserver"] == "naiad.cli:tritonserver_main"
    for runtime in RUNTIMES.values():
        assert container_command(runtime["spec"]["containers"][0])[0] == ["tritonserver"]
