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
            workers = obj["spec"].get("workerSpec", {}).get("containers", [])
            for container in [*obj["spec"].get("containers", []), *workers]:
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


# What KServe sets in a multi-node runtime's containers from the InferenceService's workerSpec,
# and what Kubernetes then expands in their args ($(VAR)).
KSERVE_MULTINODE_ENV = {"ISVC_NAME": "naiad-llm-multinode", "POD_NAMESPACE": "serving", "POD_IP": "10.1.2.3",
                        "PIPELINE_PARALLEL_SIZE": "2", "TENSOR_PARALLEL_SIZE": "1"}


def _expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args (an unknown variable stays as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), arg) for arg in args]


def test_multinode_runtime_gives_the_head_its_placement_and_the_workers_their_agent() -> None:
    from naiad import cli
    from naiad.backends.llm_settings import PLACEMENT_SETTINGS

    spec = RUNTIMES["naiad-llm-multinode"]["spec"]
    head, (worker,) = spec["containers"][0], spec["workerSpec"]["containers"]
    command, args = container_command(head)
    parsed = parse_server_command(command, _expanded(args, KSERVE_MULTINODE_ENV))
    settings = dict(item.split(",", 1)[1].split("=", 1) for item in parsed.backend_config)
    assert set(settings) <= set(PLACEMENT_SETTINGS)  # auto-complete fills exactly these
    assert settings["nnodes"] == settings["pipeline_parallel_size"] == "2"
    assert settings["master_addr"] == "10.1.2.3" and settings["tensor_parallel_size"] == "1"
    # The workers' agent, through naiad's real parser: the head's Service, the same port, no
    # node rank (rank 0 hands them out: the pods of a Deployment have no ordinal).
    command, args = container_command(worker)
    assert command == ["naiad"]
    agent = cli.build_parser().parse_args(_expanded(args, KSERVE_MULTINODE_ENV))
    assert agent.command == "llm-node" and agent.node_rank == 0 and agent.nnodes == 2
    assert agent.master_addr == "naiad-llm-multinode-head.serving.svc.cluster.local"
    assert str(agent.master_port) == settings["master_port"]
    # Both sides share the cluster key from one Secret.
    for container in (head, worker):
        (key,) = [env for env in container["env"] if env["name"] == "NAIAD_CLUSTER_KEY"]
        assert key["valueFrom"]["secretKeyRef"] == {"name": "naiad-cluster-key", "key": "key"}
    (service,) = [svc for svc in SERVICES if svc["spec"]["predictor"]["model"]["runtime"] == "naiad-llm-multinode"]
    assert service["spec"]["predictor"]["workerSpec"]["pipelineParallelSize"] == 2
