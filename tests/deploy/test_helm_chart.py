"""deploy/helm/naiad with real helm: lint, render with several values files, and check what it
renders with Kubernetes' own schemas (kubernetes-validate, strict), the CRDs' schemas
(@kubernetes-models via node) and naiad's own command-line parser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.tools import (
    ADAPTER_VALUES,
    CHART,
    VALUES_DIR,
    by_kind,
    container_command,
    helm,
    is_crd_object,
    one,
    parse_server_command,
    promql_errors,
    render_chart,
    validate_core,
    validate_crds,
)

VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
CASES = [pytest.param([], id="defaults")] + [pytest.param([path], id=path.stem) for path in VALUES_FILES]


def test_values_files_cover_the_optional_objects() -> None:
    """The rendered cases below must include every optional template at least once."""
    kinds = {obj["kind"] for path in VALUES_FILES for obj in render_chart([path])}
    assert {"HorizontalPodAutoscaler", "ScaledObject", "ServiceMonitor", "PodMonitor"} <= kinds


@pytest.mark.parametrize("values", CASES)
def test_helm_lint_is_clean(values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in values:
        args += ["-f", str(path)]
    result = helm(*args)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", CASES)
def test_rendered_objects_pass_their_schemas(values: list[Path]) -> None:
    objects = render_chart(values)
    core = [obj for obj in objects if not is_crd_object(obj)]
    for obj in core:
        validate_core(obj)  # raises kubernetes_validate.ValidationError naming the field
    custom = [obj for obj in objects if is_crd_object(obj)]
    if custom:
        failures = [result for result in validate_crds(custom) if result["error"] is not None]
        assert failures == []
    assert {"Deployment", "Service", "PodDisruptionBudget", "ServiceAccount"} <= {obj["kind"] for obj in core}


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["naiad"]
    return dict(containers[0])


@pytest.mark.parametrize("values", CASES)
def test_container_args_are_flags_naiad_accepts(values: list[Path]) -> None:
    container = _container(render_chart(values))
    command, args = container_command(container)
    assert command == ["tritonserver"]
    parsed = parse_server_command(command, args)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (parsed.http_port, parsed.grpc_port, parsed.metrics_port) == (ports["http"], ports["grpc"], ports["metrics"])


@pytest.mark.parametrize("values", CASES)
def test_probes_and_grace_period_match_the_server(values: list[Path]) -> None:
    objects = render_chart(values)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = _container(objects)
    parsed = parse_server_command(*container_command(container))
    port_names = {port["name"] for port in container["ports"]}
    for probe, path in (("startupProbe", "/v2/health/live"), ("livenessProbe", "/v2/health/live"),
                        ("readinessProbe", "/v2/health/ready")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        assert container[probe]["httpGet"]["port"] in port_names
    # SIGTERM comes after the preStop pause; the server then drains for --exit-timeout-secs.
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + parsed.exit_timeout_secs + 1
    security = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("values", CASES)
def test_services_monitors_and_budget_select_the_pods(values: list[Path]) -> None:
    objects = render_chart(values)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    container_ports = {port["name"] for port in _container(objects)["ports"]}

    def selects(selector: dict[str, str]) -> bool:
        return all(pod_labels.get(key) == value for key, value in selector.items())

    services = by_kind(objects, "Service")
    for service in services:
        assert selects(service["spec"]["selector"])
        assert {port["targetPort"] for port in service["spec"]["ports"]} <= container_ports
        grpc = [port for port in service["spec"]["ports"] if port["name"] == "grpc"]
        assert grpc and grpc[0]["appProtocol"] == "kubernetes.io/h2c"
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    given = [yaml.safe_load(path.read_text()) for path in values]
    wanted = all(v.get("headlessService", {}).get("enabled", True) for v in given)
    assert len(headless) == int(wanted)
    assert selects(one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    for monitor in by_kind(objects, "ServiceMonitor"):
        monitored = [s for s in services if all(s["metadata"]["labels"].get(k) == v
                                                for k, v in monitor["spec"]["selector"]["matchLabels"].items())]
        scraped = [s for s in monitored if "metrics" in {p["name"] for p in s["spec"]["ports"]}]
        assert len(scraped) == 1, "each pod must be scraped through exactly one Service"
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    for monitor in by_kind(objects, "PodMonitor"):
        assert selects(monitor["spec"]["selector"]["matchLabels"])
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in container_ports


def test_autoscalers_own_the_replica_count() -> None:
    hpa_objects = render_chart([VALUES_DIR / "hpa-servicemonitor.yaml"])
    hpa = one(hpa_objects, "HorizontalPodAutoscaler")
    deployment = one(hpa_objects, "Deployment")
    assert "replicas" not in deployment["spec"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    # The HPA reads the custom metric prometheus-adapter's rule serves under that name.
    rule = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"][0]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == rule["name"]["as"]
    assert hpa["spec"]["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "20000"}

    keda_objects = render_chart([VALUES_DIR / "keda-podmonitor.yaml"])
    scaled = one(keda_objects, "ScaledObject")
    assert "replicas" not in one(keda_objects, "Deployment")["spec"]
    assert by_kind(keda_objects, "HorizontalPodAutoscaler") == []  # KEDA makes its own
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    query = trigger["metadata"]["query"]
    assert 'namespace="serving"' in query and 'pod=~"demo-naiad-.*"' in query
    assert re.findall(r"rate\((\w+)\{", query) == ["nv_inference_queue_duration_us", "nv_inference_request_success"]

    assert "replicas" in one(render_chart([]), "Deployment")["spec"]


@pytest.mark.parametrize(("sets", "message"), [
    (["podAntiAffinity=sometimes"], "podAntiAffinity"),
    (["server.modelRepository="], "modelRepository"),
    (["server.extraArgs[0]=no-dashes"], "extraArgs"),
    (["ports.grpc=70000"], "grpc"),
    (["autoscaling.hpa.enabled=true", "autoscaling.keda.enabled=true"], "at most one"),
])
def test_bad_values_are_refused(sets: list[str], message: str) -> None:
    """values.schema.json (and the template's own check) stop a bad install before it renders."""
    args = ["template", "demo", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr


def test_poll_mode_renders_its_poll_interval() -> None:
    container = _container(render_chart([VALUES_DIR / "hpa-servicemonitor.yaml"]))
    parsed = parse_server_command(*container_command(container))
    assert (parsed.model_control_mode, parsed.repository_poll_secs) == ("poll", 30.0)
    assert parsed.model_repository == ["s3://models-bucket/triton"]


def _readme_helm_install() -> list[str]:
    """The README's `helm install` command line, as a user would paste it (comments dropped)."""
    readme = (CHART.parents[2] / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    command = next(block for block in blocks if "helm install naiad deploy/helm/naiad" in block)
    install = command.split("kubectl")[0]
    return re.sub(r"#[^\n]*", "", install).replace("\\\n", " ").split()


def test_readme_install_command_works_as_written() -> None:
    words = _readme_helm_install()
    assert words[:4] == ["helm", "install", "naiad", "deploy/helm/naiad"]
    # The command itself (its chart path made absolute); a client-side dry run needs no cluster.
    assert CHART.parents[2] / words[3] == CHART
    result = helm(*words[1:3], str(CHART), *words[4:], "--dry-run=client")
    assert "STATUS: pending-install" in result.stdout and "dns:///naiad-headless.serving:8001" in result.stdout
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    assert sets, "the README's helm install command has no --set"
    objects = render_chart(sets=sets, release="naiad", namespace="serving")
    for obj in objects:
        validate_core(obj)
    container = _container(objects)
    assert container["image"] == "registry.example.com/naiad:0.1.0"
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert parse_server_command(*container_command(container)).model_repository == ["s3://my-bucket/models"]
    # the names the README then uses: svc/naiad and the headless naiad-headless
    assert {s["metadata"]["name"] for s in by_kind(objects, "Service")} == {"naiad", "naiad-headless"}


def test_autoscaling_queries_are_valid_promql() -> None:
    """The KEDA query and the prometheus-adapter rule parse with Prometheus' own grammar (the
    rule after the adapter fills in its <<.LabelMatchers>> and <<.GroupBy>> templates)."""
    keda = one(render_chart([VALUES_DIR / "keda-podmonitor.yaml"]), "ScaledObject")
    rule = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"][0]
    filled = (rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="serving",pod=~"demo-naiad-.*"')
              .replace("<<.GroupBy>>", "pod"))
    assert "<<" not in filled
    queries = [keda["spec"]["triggers"][0]["metadata"]["query"], filled, rule["seriesQuery"]]
    # a broken query must be reported, or the check proves nothing
    *results, broken = promql_errors([*queries, "sum(rate(nv_inference_queue_duration_us[2m]) /"])
    assert results == [None, None, None]
    assert broken is not None
