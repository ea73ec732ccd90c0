"""Version labels, canary and A/B routing through tritonclient on HTTP and gRPC: label routing
(URL and `version_label` parameter), unknown and dangling labels, atomic promotion under
concurrent traffic without reloads, and the weighted split (docs/version_labels.md)."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from e2e.lifecycle_util import SLOW_CONFIG, slow, tagged, tagged_config, wait_for
from e2e.raw_http import http, post_json
from e2e.repo_builder import write_model

pytestmark = pytest.mark.e2e

PROTOCOLS = ["http", "grpc"]
ZEROS = np.zeros((1, 4), np.int32)


def _parameters(labels: str, split: str = "") -> str:
    text = f'parameters {{ key: "version_labels" value: {{ string_value: "{labels}" }} }}\n'
    if split:
        text += f'parameters {{ key: "version_split" value: {{ string_value: "{split}" }} }}\n'
    return text


def _labelled(labels: str, split: str = "") -> str:
    """A `tagged` model's config serving every version, with labels (and a split)."""
    return tagged_config("version_policy: { all: {} }\n" + _parameters(labels, split))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("labels")
    # Each test that changes labels has a model of its own: the tests stay independent.
    write_model(repo, "ab", _labelled("stable=1,canary=2,gone=7"), {v: tagged(v) for v in (1, 2, 3)})
    write_model(repo, "plain", tagged_config(), {1: tagged(1)})
    write_model(repo, "split", _labelled("stable=1,canary=2", "stable=90,canary=10"),
                {v: tagged(v) for v in (1, 2)})
    write_model(repo, "promo", _labelled("stable=1,canary=2"), {v: tagged(v) for v in (1, 2)})
    write_model(repo, "flip", _labelled("stable=1,canary=2"), {v: tagged(v) for v in (1, 2)})
    write_model(repo, "keep", _labelled("stable=1,canary=2"), {v: tagged(v) for v in (1, 2)})
    write_model(repo, "slowab", SLOW_CONFIG + "version_policy: { all: {} }\n" + _parameters("stable=1"),
                {1: slow, 2: slow})
    models = ["ab", "plain", "split", "promo", "flip", "keep", "slowab"]
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit"]
    for model in models:
        args += ["--load-model", model]
    with running_server(args, repo.parent / "labels.log") as process:
        yield process


def _client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(client: Any, model: str, label: Any = None, version: str = "",
           request_id: str = "") -> tuple[str, str | None]:
    """(model_version, version_label) of one request to a `tagged` model; checks that the file of
    that version answered (a `tagged` version v adds v)."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", [1, 4], "INT32")
    tensor.set_data_from_numpy(ZEROS)
    parameters = {"version_label": label} if label is not None else None
    result = client.infer(model, [tensor], model_version=version, request_id=request_id, parameters=parameters)
    response = result.get_response() if module is httpclient else result.get_response(as_json=True)
    served = response["model_version"]
    assert int(result.as_numpy("OUTPUT0")[0, 0]) == int(served)
    value = response.get("parameters", {}).get("version_label")
    if isinstance(value, dict):  # gRPC's InferParameter as JSON
        value = value["string_param"]
    return served, value


def _error(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), str(caught.value.message())


def _relabel(client: Any, model: str, labels: str | None = None, split: str | None = None) -> None:
    """A run-time label change as tritonclient sends it: a load whose config holds only labels."""
    parameters = {}
    if labels is not None:
        parameters["version_labels"] = {"string_value": labels}
    if split is not None:
        parameters["version_split"] = {"string_value": split}
    client.load_model(model, config=json.dumps({"parameters": parameters}))


# ------------------------------------------------------------------------------- routing


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_version_label_parameter_routes_requests(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    assert _infer(client, "ab", "stable") == ("1", "stable")
    assert _infer(client, "ab", "canary") == ("2", "canary")
    assert _infer(client, "ab") == ("3", None)  # neither version nor label: the version policy
    assert _infer(client, "ab", version="3") == ("3", None)
    assert _infer(client, "ab", "canary", version="2") == ("2", "canary")  # they agree


def test_grpc_stream_routes_by_label(server: ServerProcess) -> None:
    client = _client(server, "grpc")
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "INT32")
        tensor.set_data_from_numpy(ZEROS)
        client.async_stream_infer("ab", [tensor], parameters={"version_label": "canary"})
        result, error = results.get(timeout=10)
    finally:
        client.stop_stream()
    assert error is None
    response = result.get_response(as_json=True)
    assert response["model_version"] == "2"
    assert response["parameters"]["version_label"] == {"string_param": "canary"}


def test_label_in_the_http_url_routes_infer_metadata_ready_and_config(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "data": [0, 0, 0, 0]}]}
    answer = post_json(server.url, "/v2/models/ab/labels/canary/infer", body)
    assert answer.status == 200, answer.body
    document = answer.json()
    assert document["model_version"] == "2"
    assert document["parameters"] == {"version_label": "canary"}
    assert document["outputs"][0]["data"] == [2, 2, 2, 2]
    assert http(server.url, "/v2/models/ab/labels/stable").json()["versions"] == ["1"]
    assert http(server.url, "/v2/models/ab/labels/stable/ready").status == 200
    config = http(server.url, "/v2/models/ab/labels/canary/config").json()
    assert config["parameters"]["version_labels"] == {"string_value": "stable=1,canary=2,gone=7"}
    assert http(server.url, "/v2/models/ab/labels").json() == {
        "name": "ab", "labels": {"stable": 1, "canary": 2, "gone": 7}, "split": {}}
    # The path and the parameter naming different labels is a mistake, not a choice.
    body["parameters"] = {"version_label": "stable"}
    answer = post_json(server.url, "/v2/models/ab/labels/canary/infer", body)
    assert (answer.status, answer.error()) == (
        400, "the path names label 'canary' but the 'version_label' parameter names 'stable'")


def test_grpc_version_string_may_be_a_label_for_metadata_and_config(server: ServerProcess) -> None:
    client = _client(server, "grpc")
    assert client.get_model_metadata("ab", "canary").versions == ["2"]
    assert client.get_model_config("ab", "stable").config.parameters["version_labels"].string_value
    assert client.is_model_ready("ab", "stable")
    assert not client.is_model_ready("ab", "gone")
    # A string that is no label keeps Triton's error.
    status, message = _error(lambda: client.get_model_metadata("ab", "beta"))
    assert status == "StatusCode.INVALID_ARGUMENT"
    assert message.startswith("failed to get model version from specified version string 'beta'")


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unknown_label_is_a_clear_error(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    expected_status = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert _error(lambda: _infer(client, "ab", "beta")) == (
        expected_status, "label 'beta' is not defined for model 'ab'")
    assert _error(lambda: _infer(client, "plain", "stable")) == (
        expected_status, "label 'stable' is not defined for model 'plain'")
    assert _error(lambda: _infer(client, "ab", "canary", version="1")) == (
        expected_status, "model 'ab': version 1 was requested but label 'canary' names version 2")
    assert _error(lambda: _infer(client, "ab", 5)) == (
        expected_status, "the 'version_label' request parameter must be a string")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_dangling_label_is_a_clear_error(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    expected_status = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    assert _error(lambda: _infer(client, "ab", "gone")) == (
        expected_status, "version 7 of model 'ab' (label 'gone') is not ready")


def test_unknown_and_dangling_labels_in_the_http_url(server: ServerProcess) -> None:
    answer = http(server.url, "/v2/models/ab/labels/beta")
    assert (answer.status, answer.error()) == (400, "label 'beta' is not defined for model 'ab'")
    answer = http(server.url, "/v2/models/ab/labels/gone/config")
    assert (answer.status, answer.error()) == (503, "version 7 of model 'ab' (label 'gone') is not ready")
    assert http(server.url, "/v2/models/ab/labels/gone/ready").status == 400  # not ready
    assert http(server.url, "/v2/models/ab/labels/3").status == 400  # "3" is no label of ab


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_malformed_label_change_is_refused_and_keeps_the_labels(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    expected_status = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert _error(lambda: _relabel(client, "ab", split="stable=50,beta=50")) == (
        expected_status, "invalid version_split for model 'ab': label 'beta' is not defined in version_labels")
    status, message = _error(lambda: _relabel(client, "ab", labels="stable"))
    assert status == expected_status
    assert "'stable' is not a label=value pair" in message
    assert _infer(client, "ab", "stable") == ("1", "stable")


def test_raw_load_parameters_change_labels(server: ServerProcess) -> None:
    """The plain load parameters (what raw HTTP / gRPC clients can send besides `config`)."""
    answer = post_json(server.url, "/v2/repository/models/ab/load",
                       {"parameters": {"version_labels": "stable=1,canary=3,gone=7"}})
    assert answer.status == 200, answer.body
    assert _infer(_client(server, "http"), "ab", "canary") == ("3", "canary")
    assert post_json(server.url, "/v2/repository/models/ab/load",
                     {"parameters": {"version_labels": "stable=1,canary=2,gone=7"}}).status == 200
    answer = post_json(server.url, "/v2/repository/models/ab/load", {"parameters": {"version_labels": 3}})
    assert (answer.status, answer.error()) == (400, "'version_labels' parameter must be a string")
    answer = post_json(server.url, "/v2/repository/models/nosuch/load", {"parameters": {"version_labels": "a=1"}})
    assert (answer.status, answer.error()) == (
        400, "failed to change the version labels of 'nosuch': the model is not loaded")


# ------------------------------------------------------------------- weighted split


def _share(counts: Counter[str], label: str) -> float:
    return counts[label] / sum(counts.values())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_weighted_split_over_2000_requests_and_retries_land_alike(server: ServerProcess, protocol: str) -> None:
    client = _client(server, protocol)
    # Half the requests carry an id (deterministic choice), half none (random choice).
    counts: Counter[str] = Counter()
    chosen: dict[str, str] = {}
    for i in range(2000):
        request_id = f"{protocol}-{i}" if i % 2 else ""
        version, label = _infer(client, "split", request_id=request_id)
        assert (version, label) in (("1", "stable"), ("2", "canary"))
        counts[label or ""] += 1
        if request_id:
            chosen[request_id] = version
    assert set(counts) == {"stable", "canary"}
    assert abs(_share(counts, "canary") - 0.10) <= 0.03, counts
    # Retries of an id land on the version its first try went to, on either protocol.
    other = _client(server, "grpc" if protocol == "http" else "http")
    for request_id in list(chosen)[:100]:
        assert _infer(client, "split", request_id=request_id)[0] == chosen[request_id]
        assert _infer(other, "split", request_id=request_id)[0] == chosen[request_id]
    # A version or a label named by the request overrides the split.
    assert _infer(client, "split", version="2") == ("2", None)
    assert _infer(client, "split", "stable", request_id="x") == ("1", "stable")


def test_split_changes_at_run_time(server: ServerProcess) -> None:
    client = _client(server, "http")
    _relabel(client, "flip", split="stable=0,canary=1")
    assert {_infer(client, "flip", request_id=str(i)) for i in range(50)} == {("2", "canary")}
    _relabel(client, "flip", split="")  # the split removed: back to the version policy
    assert _infer(client, "flip", request_id="1") == ("2", None)
    assert http(server.url, "/v2/models/flip/labels").json()["split"] == {}


# ----------------------------------------------------------------- promotion and reloads


def _counts(client: Any, model: str) -> dict[str, int]:
    stats = client.get_inference_statistics(model)["model_stats"]
    return {entry["version"]: int(entry["inference_count"]) for entry in stats}


def test_relabel_under_concurrent_traffic_fails_no_request_and_reloads_nothing(server: ServerProcess) -> None:
    """Four clients (two per protocol) send `stable` requests while the label moves 1 → 2 → 1 → 2,
    alternately through HTTP and gRPC loads; every switch shows at once, none fails."""
    stop = threading.Event()
    seen: Counter[str] = Counter()
    failures: list[str] = []
    lock = threading.Lock()

    def hammer(protocol: str) -> None:
        client = _client(server, protocol)
        try:
            while not stop.is_set():
                try:
                    version, label = _infer(client, "promo", "stable")
                    assert label == "stable"
                except Exception as error:  # every failure counts, whatever its kind
                    with lock:
                        failures.append(repr(error))
                    continue
                with lock:
                    seen[version] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=hammer, args=(p,), daemon=True) for p in PROTOCOLS * 2]
    for thread in threads:
        thread.start()
    controls = {protocol: _client(server, protocol) for protocol in PROTOCOLS}
    try:
        wait_for(lambda: seen["1"] > 20, 15, "traffic on version 1")
        for step, target in enumerate(("2", "1", "2")):
            control = controls[PROTOCOLS[step % 2]]
            _relabel(control, "promo", f"stable={target},canary=2")
            # The switch is atomic: the first request after the load already goes to the target.
            assert _infer(control, "promo", "stable") == (target, "stable")
            before = seen[target]
            wait_for(lambda t=target, b=before: seen[t] > b + 20, 15, f"traffic on version {target}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert failures == []
    assert seen["1"] > 20 and seen["2"] > 20
    # No version reloaded: a reload starts a version's statistics from zero, so each version's
    # count still holds every request it served (the hammers', and the three checks on it).
    served = _counts(controls["http"], "promo")
    assert served == {"1": seen["1"] + 1, "2": seen["2"] + 2}
    entries = post_json(server.url, "/v2/repository/index", {}).json()
    assert {(e["version"], e["state"]) for e in entries if e["name"] == "promo"} == {("1", "READY"), ("2", "READY")}


def test_in_flight_request_finishes_where_it_started(server: ServerProcess) -> None:
    client = _client(server, "http")

    def slow_request(trips: int) -> tuple[float, str, str]:
        tensor = httpclient.InferInput("N", [1], "INT64")
        tensor.set_data_from_numpy(np.array([trips], np.int64))
        started = time.monotonic()
        response = client.infer("slowab", [tensor], parameters={"version_label": "stable"}).get_response()
        return time.monotonic() - started, response["model_version"], response["parameters"]["version_label"]

    took, _, _ = slow_request(500)
    trips = max(500, int(500 * 2.0 / max(took, 1e-3)))  # about 2 s on this machine now
    outcome: dict[str, Any] = {}

    def in_flight() -> None:
        own = httpclient.InferenceServerClient(server.url, network_timeout=60)
        tensor = httpclient.InferInput("N", [1], "INT64")
        tensor.set_data_from_numpy(np.array([trips], np.int64))
        outcome["response"] = own.infer("slowab", [tensor], parameters={"version_label": "stable"}).get_response()

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.5)  # let the request reach the server: it resolves its version on arrival
    _relabel(client, "slowab", "stable=2")
    assert slow_request(1)[1:] == ("2", "stable")  # new requests go to the new version at once
    thread.join(60)
    assert outcome["response"]["model_version"] == "1"
    assert outcome["response"]["parameters"] == {"version_label": "stable"}


def test_labels_outlive_a_plain_reload_until_a_config_brings_new_ones(server: ServerProcess) -> None:
    client = _client(server, "grpc")
    _infer(client, "keep", "canary")
    _relabel(client, "keep", "stable=2,canary=2")
    client.load_model("keep")  # a plain reload: versions unchanged, run-time labels kept
    assert _infer(client, "keep", "stable") == ("2", "stable")
    config = client.get_model_config("keep", as_json=True)["config"]
    assert config["parameters"]["version_labels"] == {"string_value": "stable=2,canary=2"}
    config["parameters"]["version_labels"] = {"string_value": "stable=1,canary=1"}
    client.load_model("keep", config=json.dumps(config))  # a new config brings its own labels
    assert _infer(client, "keep", "canary") == ("1", "canary")
    # Neither load reloaded a version: version 2 still counts the requests of before.
    assert _counts(_client(server, "http"), "keep")["2"] == 2
