"""The command line: Triton's flag forms and checks (SPEC §7), `naiad serve` end to end, and
`naiad config MODEL_DIR`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import build_models
import pytest
import tritonclient.http as httpclient
from conftest import ROOT
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from e2e.lifecycle_util import index_by_name
from e2e.raw_http import http
from e2e.repo_builder import write_model
from naiad.cli import build_parser, main, options_from_args
from naiad.config.options import ServerOptions

NAIAD = [sys.executable, "-m", "naiad.cli"]


def _options(*argv: str) -> ServerOptions:
    parser = build_parser()
    return options_from_args(parser.parse_args(["serve", "--model-repository", "/models", *argv]), parser)


def _parse_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        _options(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


# ----------------------------------------------------------------------------- parsing


def test_defaults_follow_tritonserver() -> None:
    options = _options()
    assert options.model_repositories == (Path("/models"),)
    assert options.model_control_mode == "none"
    assert options.repository_poll_secs == 15
    assert options.exit_on_error and options.strict_readiness and options.auto_complete_config
    assert options.exit_timeout_secs == 30
    assert options.model_load_thread_count == 4
    assert (options.http_port, options.grpc_port, options.metrics_port) == (8000, 8001, 8002)
    assert options.http_address == "0.0.0.0"
    assert options.http_max_input_size == 64 * 1024 * 1024


def test_flag_value_and_flag_equals_value_are_the_same() -> None:
    spaced = _options("--model-control-mode", "explicit", "--load-model", "a", "--load-model", "b",
                      "--exit-timeout-secs", "5", "--http-port", "9000", "--exit-on-error", "false",
                      "--model-config-name", "h100")
    joined = _options("--model-control-mode=explicit", "--load-model=a", "--load-model=b",
                      "--exit-timeout-secs=5", "--http-port=9000", "--exit-on-error=false",
                      "--model-config-name=h100")
    assert spaced == joined
    assert joined.load_models == ("a", "b")
    assert joined.exit_timeout_secs == 5 and joined.http_port == 9000 and not joined.exit_on_error
    assert joined.model_config_name == "h100"


@pytest.mark.parametrize(("argv", "expected"), [
    (["--strict-readiness=false"], False),
    (["--strict-readiness", "0"], False),
    (["--strict-readiness=true"], True),
    (["--strict-readiness"], True),
    (["--strict-readiness=off"], False),
])
def test_boolean_flags(argv: list[str], expected: bool) -> None:
    assert _options(*argv).strict_readiness is expected


def test_a_bad_boolean_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert "expected a boolean" in _parse_error(capsys, "--exit-on-error=maybe")


def test_repeated_repositories_and_the_model_store_alias() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--model-repository", "/a", "--model-store=/b"])
    assert options_from_args(args, parser).model_repositories == (Path("/a"), Path("/b"))


def test_load_model_requires_explicit_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--load-model requires --model-control-mode=explicit" in _parse_error(capsys, "--load-model=simple")
    assert "--load-model" in _parse_error(capsys, "--model-control-mode=poll", "--load-model", "simple")


def test_repository_poll_secs_requires_poll_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--repository-poll-secs" in _parse_error(capsys, "--repository-poll-secs=1")
    assert _options("--model-control-mode=poll", "--repository-poll-secs=1").repository_poll_secs == 1


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("1048576", 1 << 20), ("512M", 512 << 20),
                                                 ("8G", 8 << 30), ("8Gi", 8 << 30), ("1.5gb", 3 << 29)])
def test_a_memory_budget_takes_units_and_turns_on_demand_loading_on(value: str, expected: int) -> None:
    options = _options(f"--model-memory-budget={value}")
    assert options.model_memory_budget == expected
    assert options.model_load_on_demand is (expected > 0)
    assert _options("--model-load-on-demand").model_load_on_demand and not _options().model_load_on_demand


@pytest.mark.parametrize("value", ["lots", "-1G", "8X"])
def test_a_bad_memory_budget_is_an_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    assert "--model-memory-budget" in _parse_error(capsys, f"--model-memory-budget={value}")


def test_load_model_star_and_poll_secs() -> None:
    assert _options("--model-control-mode=explicit", "--load-model=*").load_models == ("*",)


def test_auto_complete_switches() -> None:
    assert not _options("--disable-auto-complete-config").auto_complete_config
    assert not _options("--strict-model-config=true").auto_complete_config
    assert _options("--strict-model-config=false").auto_complete_config


def test_backend_config_default_max_batch_size() -> None:
    assert _options("--backend-config=default-max-batch-size=8").default_max_batch_size == 8
    assert _options("--backend-config", "onnxruntime,enable-global-threadpool=1").backend_config == {
        "onnxruntime": {"enable-global-threadpool": "1"}}


def test_missing_model_repository_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve"])
    assert exited.value.code == 2
    assert "--model-repository" in capsys.readouterr().err


# ----------------------------------------------------------------------------- processes


@pytest.mark.e2e
def test_serve_rejects_load_model_without_explicit_mode(example_repo: Path) -> None:
    done = subprocess.run([*NAIAD, "serve", "--model-repository", str(example_repo), "--load-model", "simple"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert "--load-model requires --model-control-mode=explicit" in done.stderr


@pytest.mark.e2e
def test_serve_with_mixed_flag_forms(example_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(example_repo), "--model-control-mode", "explicit",
                           "--load-model=simple", "--load-model", "identity", "--log-verbose", "1",
                           "--log-format=ISO8601", "--log-info", "false", "--exit-timeout-secs", "5"])
    index = index_by_name(server.url)
    assert [e["state"] for e in index["simple"]] == ["READY", "READY"]
    assert [e["state"] for e in index["identity"]] == ["READY"]
    assert index["minilm"] == [{"name": "minilm"}]
    assert httpclient.InferenceServerClient(server.url).get_log_settings() == {
        "log_file": "", "log_info": False, "log_warning": True, "log_error": True,
        "log_verbose_level": 1, "log_format": "ISO8601"}
    assert http(server.url, "/v2/health/ready").status == 200


@pytest.mark.e2e
def test_config_prints_valid_pbtxt_for_a_config_less_model(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "auto_model", None, {1: build_models.add_sub})
    done = subprocess.run([*NAIAD, "config", str(model_dir)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    config = text_format.Parse(done.stdout, model_config_pb2.ModelConfig())
    assert config.name == "auto_model"
    assert config.backend == "onnxruntime"
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_INT32, [16]), ("INPUT1", model_config_pb2.TYPE_INT32, [16])]
    assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
    assert config.instance_group and config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_config_of_a_missing_model_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_config_honours_model_config_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_dir = write_model(tmp_path, "named", None, {1: build_models.add_sub})
    (model_dir / "configs").mkdir()
    (model_dir / "configs" / "small.pbtxt").write_text("max_batch_size: 2")
    assert main(["config", str(model_dir), "--model-config-name", "small"]) == 0
    config = text_format.Parse(capsys.readouterr().out, model_config_pb2.ModelConfig())
    assert config.max_batch_size == 2


def test_rate_limit_flags() -> None:
    options = _options("--rate-limit=execution_count", "--rate-limit-resource=R1:4",
                       "--rate-limit-resource", "R2:1:0")
    assert options.rate_limit == "execution_count"
    assert options.rate_limit_resources == {("R1", None): 4, ("R2", 0): 1}
    with pytest.raises(SystemExit):
        _options("--rate-limit-resource=R1")
