"""Model lifecycle on real servers: version policies, poll mode (add / change / remove / break /
fix, reload under traffic), several repositories, startup failures, config selection and
auto-complete, and draining on SIGTERM (SPEC §2, §7)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import build_models
import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import (
    SLOW_CONFIG,
    add_model,
    add_version,
    broken,
    index_by_name,
    remove_model,
    replace_file,
    slow,
    tagged,
    tagged_config,
    wait_for,
    write_text_atomic,
)
from e2e.raw_http import http
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

POLL_WAIT = 15.0  # seconds a poll-mode change may take to show (poll interval is 1 s)


def _infer(client: Any, model: str, version: str = "") -> tuple[str, int]:
    """(model_version, tag) of one request to a `tagged` model."""
    tensor = httpclient.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 4), np.int32))
    result = client.infer(model, [tensor], model_version=version)
    return result.get_response()["model_version"], int(result.as_numpy("OUTPUT0")[0, 0])


def _versions(client: Any, model: str) -> list[str] | None:
    try:
        return list(client.get_model_metadata(model)["versions"])
    except InferenceServerException:
        return None


def _three_versions(repo: Path, name: str, policy: str) -> None:
    write_model(repo, name, tagged_config(policy), {v: tagged(v) for v in (1, 2, 3)})


# ------------------------------------------------------------------------ version policy


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("policies")
    _three_versions(repo, "latest1", "")
    _three_versions(repo, "latest2", "version_policy: { latest: { num_versions: 2 } }")
    _three_versions(repo, "every", "version_policy: { all: {} }")
    _three_versions(repo, "specific", "version_policy: { specific: { versions: [1, 3] } }")
    for ignored in ("0", "04", "notes"):  # not version directories (SPEC §2)
        (repo / "every" / ignored).mkdir()
        tagged(99)(repo / "every" / ignored / "model.onnx")
    with running_server(["--model-repository", str(repo)], repo.parent / "policies.log") as server:
        yield server


@pytest.mark.parametrize(("model", "served"), [
    ("latest1", ["3"]), ("latest2", ["2", "3"]), ("every", ["1", "2", "3"]), ("specific", ["1", "3"]),
])
def test_version_policy_selects_versions(policy_server: ServerProcess, model: str, served: list[str]) -> None:
    client = httpclient.InferenceServerClient(policy_server.url)
    assert client.get_model_metadata(model)["versions"] == served
    for version in ("1", "2", "3"):
        assert client.is_model_ready(model, version) == (version in served)
    for version in served:
        assert _infer(client, model, version) == (version, int(version))
    entries = index_by_name(policy_server.url)[model]
    assert [(e["version"], e["state"]) for e in entries] == [(v, "READY") for v in served]
    stats = client.get_inference_statistics(model)["model_stats"]
    assert [s["version"] for s in stats] == served


@pytest.mark.parametrize(("model", "highest"), [("latest1", 3), ("latest2", 3), ("every", 3), ("specific", 3)])
def test_request_without_version_goes_to_highest(policy_server: ServerProcess, model: str, highest: int) -> None:
    client = httpclient.InferenceServerClient(policy_server.url)
    assert _infer(client, model) == (str(highest), highest)


def test_request_for_a_version_outside_the_policy_fails(policy_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(policy_server.url)
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "specific", "2")
    assert caught.value.status() in ("400", "404")
    assert "'specific' version 2" in caught.value.message()


# ------------------------------------------------------------------------------ poll mode


@pytest.fixture(scope="module")
def poll_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("poll")
    for name in ("grow", "reconfig", "doomed", "flaky", "hammered"):
        write_model(repo, name, tagged_config(), {1: tagged(1)})
    return repo


@pytest.fixture(scope="module")
def poll_server(poll_repo: Path) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(poll_repo), "--model-control-mode=poll", "--repository-poll-secs=1"]
    with running_server(args, poll_repo.parent / "poll.log") as server:
        yield server


@pytest.fixture
def poll_client(poll_server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(poll_server.url)


def test_poll_picks_up_a_new_version(poll_repo: Path, poll_server: ServerProcess, poll_client: Any) -> None:
    assert _infer(poll_client, "grow") == ("1", 1)
    add_version(poll_repo / "grow", 2, tagged(2))
    wait_for(lambda: _versions(poll_client, "grow") == ["2"], POLL_WAIT, "version 2 of 'grow'")
    assert _infer(poll_client, "grow") == ("2", 2)
    assert not poll_client.is_model_ready("grow", "1")
    assert index_by_name(poll_server.url)["grow"] == [
        {"name": "grow", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "grow", "version": "2", "state": "READY"},
    ]


def test_poll_picks_up_a_config_change(poll_repo: Path, poll_client: Any) -> None:
    assert poll_client.get_model_config("reconfig")["max_batch_size"] == 8
    config = tagged_config().replace("max_batch_size: 8", "max_batch_size: 2")
    write_text_atomic(poll_repo / "reconfig" / "config.pbtxt", config)
    wait_for(lambda: poll_client.get_model_config("reconfig")["max_batch_size"] == 2, POLL_WAIT,
             "the new config of 'reconfig'")
    assert _infer(poll_client, "reconfig") == ("1", 1)


def test_poll_unloads_a_removed_model(poll_repo: Path, poll_server: ServerProcess, poll_client: Any) -> None:
    assert poll_client.is_model_ready("doomed")
    remove_model(poll_repo, "doomed")
    wait_for(lambda: not poll_client.is_model_ready("doomed"), POLL_WAIT, "'doomed' to unload")
    with pytest.raises(InferenceServerException) as caught:
        poll_client.get_model_metadata("doomed")
    assert caught.value.message() == "Request for unknown model: 'doomed' is not found"
    assert "doomed" not in index_by_name(poll_server.url)


def test_poll_adds_models_and_shows_a_broken_one(poll_repo: Path, poll_server: ServerProcess,
                                                 poll_client: Any) -> None:
    add_model(poll_repo, "newcomer", tagged_config(), {1: tagged(4)})
    add_model(poll_repo, "newbroken", tagged_config(), {1: broken})
    wait_for(lambda: poll_client.is_model_ready("newcomer"), POLL_WAIT, "'newcomer' to load")
    assert _infer(poll_client, "newcomer") == ("1", 4)

    def broken_entry() -> Any:
        entries = index_by_name(poll_server.url).get("newbroken", [])
        return entries if entries and entries[0].get("state") == "UNAVAILABLE" else None

    (entry,) = wait_for(broken_entry, POLL_WAIT, "'newbroken' to fail")
    assert entry["reason"]
    assert not poll_client.is_model_ready("newbroken")
    assert poll_client.is_model_ready("grow") and poll_client.is_model_ready("newcomer")


def test_poll_keeps_the_old_version_while_broken_then_takes_the_fix(
        poll_repo: Path, poll_server: ServerProcess, poll_client: Any) -> None:
    assert _infer(poll_client, "flaky") == ("1", 1)
    add_version(poll_repo / "flaky", 2, broken)

    def failed_version_2() -> Any:
        entries = {e.get("version"): e for e in index_by_name(poll_server.url)["flaky"]}
        return entries.get("2", {}).get("state") == "UNAVAILABLE" and entries

    entries = wait_for(failed_version_2, POLL_WAIT, "version 2 of 'flaky' to fail")
    assert entries["2"]["reason"]
    assert entries["1"]["state"] == "READY"
    assert _infer(poll_client, "flaky") == ("1", 1)  # the old version keeps serving
    assert poll_client.get_model_metadata("flaky")["versions"] == ["1"]

    replace_file(poll_repo / "flaky" / "2" / "model.onnx", tagged(5))
    wait_for(lambda: _versions(poll_client, "flaky") == ["2"], POLL_WAIT, "the fixed version 2 of 'flaky'")
    assert _infer(poll_client, "flaky") == ("2", 5)


def test_load_and_unload_in_poll_mode_are_503(poll_client: Any) -> None:
    for call in (poll_client.load_model, poll_client.unload_model):
        with pytest.raises(InferenceServerException) as caught:
            call("grow")
        assert (caught.value.status(), caught.value.message()) == (
            "503", "explicit model load / unload is not allowed if polling is enabled")


def test_reload_under_traffic_fails_no_request(poll_repo: Path, poll_server: ServerProcess) -> None:
    """Four clients hammer 'hammered' (no version: the highest) while poll reloads it three times."""
    stop = threading.Event()
    seen: Counter[tuple[str, int]] = Counter()
    failures: list[str] = []
    lock = threading.Lock()

    def hammer() -> None:
        client = httpclient.InferenceServerClient(poll_server.url)
        try:
            while not stop.is_set():
                try:
                    answer = _infer(client, "hammered")
                except Exception as error:  # every failure counts, whatever its kind
                    with lock:
                        failures.append(repr(error))
                    continue
                with lock:
                    seen[answer] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    client = httpclient.InferenceServerClient(poll_server.url)
    model = poll_repo / "hammered"
    try:
        wait_for(lambda: seen[("1", 1)] > 20, POLL_WAIT, "traffic on version 1")
        add_version(model, 2, tagged(2))
        wait_for(lambda: seen[("2", 2)] > 20, POLL_WAIT, "traffic on version 2")
        write_text_atomic(model / "config.pbtxt", tagged_config(
            "instance_group [ { kind: KIND_CPU count: 2 } ]").replace("max_batch_size: 8", "max_batch_size: 6"))
        wait_for(lambda: client.get_model_config("hammered")["max_batch_size"] == 6, POLL_WAIT, "new config")
        before = sum(seen.values())
        wait_for(lambda: sum(seen.values()) > before + 20, POLL_WAIT, "traffic after the config change")
        add_version(model, 3, tagged(3))
        wait_for(lambda: seen[("3", 3)] > 20, POLL_WAIT, "traffic on version 3")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == []
    assert set(seen) == {("1", 1), ("2", 2), ("3", 3)}
    assert client.get_model_metadata("hammered")["versions"] == ["3"]


# -------------------------------------------------------------------- several repositories


def test_several_repositories_and_a_duplicate_name(tmp_path: Path, start_server: Any) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "alpha", tagged_config(), {1: tagged(1)})
    write_model(first, "twice", tagged_config(), {1: tagged(2)})
    write_model(second, "beta", tagged_config(), {1: tagged(3)})
    write_model(second, "twice", tagged_config(), {1: tagged(4)})
    server = start_server(["--model-repository", str(first), "--model-repository", str(second),
                           "--exit-on-error=false"], ready=False)
    client = httpclient.InferenceServerClient(server.url)
    assert _infer(client, "alpha") == ("1", 1)
    assert _infer(client, "beta") == ("1", 3)
    assert not client.is_model_ready("twice")
    assert index_by_name(server.url)["twice"] == [
        {"name": "twice", "state": "UNAVAILABLE", "reason": "model appears in two or more repositories"}]


# ---------------------------------------------------------------------- startup failures


@pytest.fixture
def half_broken_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "half"
    write_model(repo, "good", tagged_config(), {1: tagged(1)})
    write_model(repo, "bad", tagged_config(), {1: broken})
    return repo


def test_startup_failure_without_exit_on_error_serves_the_rest(half_broken_repo: Path,
                                                                start_server: Any) -> None:
    server = start_server(["--model-repository", str(half_broken_repo), "--exit-on-error=false",
                           "--strict-readiness=true"], ready=False)
    client = httpclient.InferenceServerClient(server.url)
    assert _infer(client, "good") == ("1", 1)
    assert not client.is_model_ready("bad")
    (entry,) = index_by_name(server.url)["bad"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]
    ready = http(server.url, "/v2/health/ready")
    assert (ready.status, ready.body) == (400, b"")
    assert http(server.url, "/v2/health/live").status == 200


def test_startup_failure_without_strict_readiness_is_ready(half_broken_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(half_broken_repo), "--exit-on-error=false",
                           "--strict-readiness=false"])
    assert http(server.url, "/v2/health/ready").status == 200
    assert not httpclient.InferenceServerClient(server.url).is_model_ready("bad")


def test_startup_failure_exits_non_zero_by_default(half_broken_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(half_broken_repo)], wait=False)
    assert server.process.wait(60) != 0
    assert "bad" in server.logs()


# ------------------------------------------------------------------ config selection


@pytest.fixture
def config_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "configs"
    named = write_model(repo, "named", tagged_config(), {1: tagged(1)})
    (named / "configs").mkdir()
    (named / "configs" / "alt.pbtxt").write_text(tagged_config().replace("max_batch_size: 8", "max_batch_size: 2"))
    write_model(repo, "plain", tagged_config(), {1: tagged(2)})
    write_model(repo, "auto", None, {1: build_models.add_sub})
    return repo


def test_model_config_name_and_auto_complete(config_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(config_repo), "--model-config-name=alt"])
    client = httpclient.InferenceServerClient(server.url)
    assert client.get_model_config("named")["max_batch_size"] == 2
    assert client.get_model_config("plain")["max_batch_size"] == 8
    config = client.get_model_config("auto")
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert isinstance(config["dynamic_batching"]["max_queue_delay_microseconds"], int)
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
    inputs = [httpclient.InferInput(n, [2, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.full((2, 16), 3, np.int32))
    result = client.infer("auto", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((2, 16), 6, np.int32))


def test_disable_auto_complete_fails_a_config_less_model(config_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(config_repo), "--disable-auto-complete-config",
                           "--exit-on-error=false"], ready=False)
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("plain")
    assert not client.is_model_ready("auto")
    (entry,) = index_by_name(server.url)["auto"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]


# ------------------------------------------------------------------------------ shutdown


@pytest.fixture
def slow_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "slow"
    write_model(repo, "slow", SLOW_CONFIG, {1: slow})
    return repo


def _slow_request(url: str, trips: int) -> tuple[float, Any]:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    tensor = httpclient.InferInput("N", [1], "INT64")
    tensor.set_data_from_numpy(np.array([trips], np.int64))
    started = time.monotonic()
    result = client.infer("slow", [tensor])
    return time.monotonic() - started, result.as_numpy("OUT")


def _trips_for(url: str, seconds: float) -> int:
    """Loop trips of the slow model that take about `seconds` on this machine now."""
    trips = 1000
    took, _ = _slow_request(url, trips)
    return max(trips, int(trips * seconds / max(took, 1e-3)))


def test_sigterm_drains_in_flight_requests_then_exits_zero(slow_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(slow_repo), "--exit-timeout-secs=20"])
    trips = _trips_for(server.url, 1.5)
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        try:
            outcome["result"] = _slow_request(server.url, trips)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.3)  # let the request reach the model
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    statuses = []
    while thread.is_alive():
        try:
            statuses.append(http(server.url, "/v2/health/ready", timeout=2).status)
        except OSError:
            statuses.append(0)
        time.sleep(0.05)
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    _, values = outcome["result"]
    assert values.shape == (1,)
    # While the request drains, new connections are refused, as Triton does since 24.04 (the
    # first probe may race the signal's delivery).
    assert 0 in statuses
    assert 200 not in statuses[statuses.index(0):]
    assert server.process.wait(20) == 0
    assert time.monotonic() - signalled < 20


def test_sigterm_exits_at_the_exit_timeout_when_a_request_overruns(slow_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(slow_repo), "--exit-timeout-secs=1"])
    trips = _trips_for(server.url, 6.0)
    thread = threading.Thread(target=lambda: _ignore_errors(_slow_request, server.url, trips), daemon=True)
    thread.start()
    time.sleep(0.3)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(20) == 1  # as Triton: "Exit timeout expired. Exiting immediately."
    assert time.monotonic() - signalled < 3.5  # the 1 s timeout, plus unloading and interpreter exit


def _ignore_errors(call: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # the server gives up on this request at the exit timeout
        call(*args)


def test_sigterm_with_nothing_in_flight_exits_zero_at_once(slow_repo: Path, start_server: Any) -> None:
    server = start_server(["--model-repository", str(slow_repo)])
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(15) == 0
    assert time.monotonic() - signalled < 5
