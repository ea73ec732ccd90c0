"""The sequence batcher in a real server, driven by tritonclient over HTTP and gRPC: a Python
accumulator model (tests/e2e/sequence_models/accumulator.py) keeps its running sum in implicit
state and echoes the control values it is fed."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from e2e.concurrency import in_threads

pytestmark = pytest.mark.e2e

MODEL_PY = Path(__file__).parent / "sequence_models" / "accumulator.py"
CLIENTS = {"http": httpclient, "grpc": grpcclient}
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "CONTROLS" data_type: TYPE_INT32 dims: [ 3 ] }},
  {{ name: "CORRID_SEEN" data_type: {corrid} dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}
  {extra_output}
]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_s" value {{ string_value: "{delay}" }} }}
"""
MODELS: dict[str, dict[str, Any]] = {
    "acc_direct": {"strategy": "direct { }", "delay": "0.02"},
    "acc_oldest": {"strategy": "oldest { max_candidate_sequences: 6 preferred_batch_size: [ 3 ] }", "delay": "0.02"},
    "acc_string": {"corrid": "TYPE_STRING"},
    "acc_idle": {"max_batch_size": 1, "idle_us": 400_000},
    "acc_state_out": {"extra_output": ', { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }'},
}
DEFAULTS = {"max_batch_size": 4, "corrid": "TYPE_UINT64", "extra_output": "", "idle_us": 5_000_000,
            "strategy": "direct { }", "delay": "0"}


ONNX_CONFIG = """
name: "acc_onnx"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] },
  { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  direct { max_queue_delay_microseconds: 5000000 minimum_slot_utilization: 1.0 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" name: "from file" } } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _onnx_accumulator(path: Path) -> None:
    """OUTPUT = STATE_OUT = (STATE_IN + INPUT) * READY and START_OUT = START, CORRID_OUT = CORRID,
    all batched along dim 0."""
    import onnx
    from onnx import TensorProto, helper

    def value(name: str, kind: int) -> Any:
        return helper.make_tensor_value_info(name, kind, [None, 1])

    nodes = [
        helper.make_node("Add", ["STATE_IN", "INPUT"], ["sum"]),
        helper.make_node("Cast", ["READY"], ["ready"], to=TensorProto.INT32),
        helper.make_node("Mul", ["sum", "ready"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
        helper.make_node("Identity", ["START"], ["START_OUT"]),
    ]
    graph = helper.make_graph(
        nodes, "accumulator",
        [value("INPUT", TensorProto.INT32), value("START", TensorProto.INT32), value("READY", TensorProto.BOOL),
         value("CORRID", TensorProto.UINT64), value("STATE_IN", TensorProto.INT32)],
        [value("OUTPUT", TensorProto.INT32), value("STATE_OUT", TensorProto.INT32),
         value("CORRID_OUT", TensorProto.UINT64), value("START_OUT", TensorProto.INT32)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequence")
    for name, settings in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, **{**DEFAULTS, **settings}))
        shutil.copy(MODEL_PY, repo / name / "1" / "model.py")
    (repo / "acc_onnx" / "1").mkdir(parents=True)
    (repo / "acc_onnx" / "initial_state").mkdir()
    (repo / "acc_onnx" / "initial_state" / "hundred").write_bytes(np.array([100], dtype=np.int32).tobytes())
    (repo / "acc_onnx" / "config.pbtxt").write_text(ONNX_CONFIG)
    _onnx_accumulator(repo / "acc_onnx" / "1" / "model.onnx")
    with running_server(["--model-repository", str(repo)], repo / "naiad.log") as running:
        yield running


def _client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url, concurrency=4)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(server: ServerProcess, protocol: str, model: str, value: int, rows: int = 1,
           outputs: list[str] | None = None, extra: list[tuple[str, np.ndarray]] = (), **sequence: Any) -> Any:
    module = CLIENTS[protocol]
    inputs = []
    for name, array in [("INPUT", np.full((rows, 1), value, dtype=np.int32)), *extra]:
        tensor = module.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = None if outputs is None else [module.InferRequestedOutput(n) for n in outputs]
    client = _client(server, protocol)
    try:
        return client.infer(model, inputs, outputs=requested, **sequence)
    finally:
        client.close()


def _run_sequence(server: ServerProcess, protocol: str, model: str, sequence_id: Any,
                  values: list[int]) -> list[tuple[int, list[int], Any]]:
    """Send one whole sequence; (OUTPUT, CONTROLS, CORRID_SEEN) per request."""
    seen = []
    for i, value in enumerate(values):
        result = _infer(server, protocol, model, value, sequence_id=sequence_id,
                        sequence_start=i == 0, sequence_end=i == len(values) - 1)
        seen.append((int(result.as_numpy("OUTPUT")[0, 0]), result.as_numpy("CONTROLS")[0].tolist(),
                     result.as_numpy("CORRID_SEEN")[0, 0]))
    return seen


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        call()
    return raised.value


def test_server_metadata_lists_the_sequence_extension(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        assert "sequence" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
def test_interleaved_sequences_on_several_clients_keep_their_own_sums(server: ServerProcess, protocol: str,
                                                                     model: str) -> None:
    base = {"acc_direct": 1000, "acc_oldest": 2000}[model] + (0 if protocol == "http" else 500)
    values = {base + k: [k * 10 + i for i in range(1, 7)] for k in range(1, 7)}
    before = _batch_sizes(server, model)
    results = in_threads(*[partial(_run_sequence, server, protocol, model, sid, v) for sid, v in values.items()])
    for (sid, sent), seen in zip(values.items(), results, strict=True):
        assert not isinstance(seen, Exception), seen
        assert [s[0] for s in seen] == np.cumsum(sent).tolist()
        assert [s[1] for s in seen] == [[1, 0, 1]] + [[0, 0, 1]] * 4 + [[0, 1, 1]]  # START, END, READY
        assert all(int(s[2]) == sid for s in seen)
    after = _batch_sizes(server, model)
    batches = {size: count - before.get(size, 0) for size, count in after.items() if count > before.get(size, 0)}
    assert sum(size * count for size, count in batches.items()) == 36
    assert max(batches) > 1, batches  # sequences did share executions


def _batch_sizes(server: ServerProcess, model: str) -> dict[int, int]:
    with httpclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_correlation_ids(server: ServerProcess, protocol: str) -> None:
    sid = f"session-{protocol}-Ω"
    seen = _run_sequence(server, protocol, "acc_string", sid, [5, 6, 7])
    assert [s[0] for s in seen] == [5, 11, 18]
    assert all(s[2] == sid.encode() for s in seen)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequence_errors_use_triton_s_messages(server: ServerProcess, protocol: str) -> None:
    no_id = _error(lambda: _infer(server, protocol, "acc_direct", 1))
    assert "inference request to model 'acc_direct' must specify a non-zero or non-empty correlation ID" \
        in no_id.message()
    no_start = _error(lambda: _infer(server, protocol, "acc_direct", 1, sequence_id=37469245))
    assert no_start.message() == ("[request id: <id_unknown>] inference request for sequence 37469245 to model "
                                  "'acc_direct' must specify the START flag on the first request of the sequence")
    batch = _error(lambda: _infer(server, protocol, "acc_direct", 1, rows=2, sequence_id=5, sequence_start=True))
    assert batch.message() == ("[request id: <id_unknown>] inference request to model 'acc_direct' must specify "
                               "batch-size 1 due to requirements of sequence batcher")
    for error in (no_id, no_start, batch):
        assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_control_and_state_inputs_come_only_from_the_server(server: ServerProcess, protocol: str) -> None:
    sent = _error(lambda: _infer(server, protocol, "acc_direct", 1, sequence_id=6, sequence_start=True,
                                 extra=[("START", np.ones((1, 1), dtype=np.int32))]))
    assert "unexpected inference input 'START' for model 'acc_direct'" in sent.message()
    state = _error(lambda: _infer(server, protocol, "acc_direct", 1, sequence_id=6, sequence_start=True,
                                  extra=[("STATE_IN", np.ones((1, 1), dtype=np.int32))]))
    assert "unexpected inference input 'STATE_IN' for model 'acc_direct'" in state.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_state_output_only_when_declared_and_requested(server: ServerProcess, protocol: str) -> None:
    hidden = _infer(server, protocol, "acc_direct", 4, sequence_id=77, sequence_start=True, sequence_end=True)
    assert hidden.as_numpy("STATE_OUT") is None and int(hidden.as_numpy("OUTPUT")[0, 0]) == 4
    undeclared = _error(lambda: _infer(server, protocol, "acc_direct", 1, sequence_id=78, sequence_start=True,
                                       outputs=["STATE_OUT"]))
    assert "unexpected inference output 'STATE_OUT' for model 'acc_direct'" in undeclared.message()
    first = _infer(server, protocol, "acc_state_out", 4, sequence_id=79, sequence_start=True)
    assert int(first.as_numpy("STATE_OUT")[0, 0]) == 4  # declared: part of "all outputs"
    named = _infer(server, protocol, "acc_state_out", 3, sequence_id=79, outputs=["STATE_OUT"])
    assert int(named.as_numpy("STATE_OUT")[0, 0]) == 7 and named.as_numpy("OUTPUT") is None
    only = _infer(server, protocol, "acc_state_out", 3, sequence_id=79, outputs=["OUTPUT"], sequence_end=True)
    assert int(only.as_numpy("OUTPUT")[0, 0]) == 10 and only.as_numpy("STATE_OUT") is None


def test_idle_sequence_is_released_and_frees_its_slot_for_the_backlog(server: ServerProcess) -> None:
    started = time.monotonic()  # sequence 1 cannot idle out before this + 0.4 s
    first = _infer(server, "http", "acc_idle", 2, sequence_id=1, sequence_start=True)
    assert int(first.as_numpy("OUTPUT")[0, 0]) == 2
    # The model has one slot, held by sequence 1: sequence 2 waits in the backlog until 1 idles out.
    second = _infer(server, "grpc", "acc_idle", 5, sequence_id=2, sequence_start=True)
    assert int(second.as_numpy("OUTPUT")[0, 0]) == 5
    assert time.monotonic() - started >= 0.4
    late = _error(lambda: _infer(server, "http", "acc_idle", 1, sequence_id=1))
    assert "inference request for sequence 1 to model 'acc_idle' must specify the START flag" in late.message()
    restarted = _infer(server, "http", "acc_idle", 9, sequence_id=1, sequence_start=True, sequence_end=True)
    assert int(restarted.as_numpy("OUTPUT")[0, 0]) == 9  # once sequence 2 idled out too: fresh state


def test_a_sequence_over_one_grpc_stream(server: ServerProcess) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, value in enumerate([1, 2, 3, 4]):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, dtype=np.int32))
            client.async_stream_infer("acc_direct", [tensor], request_id=str(i), sequence_id=4242,
                                      sequence_start=i == 0, sequence_end=i == 3)
        results = [answers.get(timeout=30) for _ in range(4)]
    finally:
        client.stop_stream()
        client.close()
    assert all(not isinstance(r, Exception) for r in results), results
    by_id = {r.get_response().id: int(r.as_numpy("OUTPUT")[0, 0]) for r in results}
    assert by_id == {"0": 1, "1": 3, "2": 6, "3": 10}


def test_many_clients_racing_one_instance_never_mix_sequences(server: ServerProcess) -> None:
    """Every request of every sequence sent at once from its own thread after its START: the
    batcher must still run each sequence's requests one at a time (sums stay consistent)."""
    totals: dict[int, list[int]] = {}
    lock = threading.Lock()

    def sequence(sid: int) -> None:
        _infer(server, "grpc", "acc_direct", 1, sequence_id=sid, sequence_start=True)
        outputs = in_threads(*[partial(_infer, server, "grpc", "acc_direct", 1, sequence_id=sid)] * 5)
        with lock:
            totals[sid] = sorted(int(o.as_numpy("OUTPUT")[0, 0]) for o in outputs)
        _infer(server, "grpc", "acc_direct", 0, sequence_id=sid, sequence_end=True)

    in_threads(*[partial(sequence, sid) for sid in (9001, 9002, 9003)])
    assert totals == {sid: [2, 3, 4, 5, 6] for sid in (9001, 9002, 9003)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_model_gets_batched_controls_and_state(server: ServerProcess, protocol: str) -> None:
    """Four sequences on an ONNX model whose direct batcher waits (up to 5 s, so that sequences
    started 50 ms apart meet however busy the machine) for all four slots: control and state
    tensors are concatenated into [batch, 1] and the state output split back per sequence; the
    state starts from the config's initial_state data file (100)."""
    base = 300 if protocol == "http" else 400
    before = _batch_sizes(server, "acc_onnx")

    def run(sid: int) -> list[tuple[int, int, int]]:
        seen = []
        for i in range(4):
            result = _infer(server, protocol, "acc_onnx", sid - base, sequence_id=sid, sequence_start=i == 0,
                            sequence_end=i == 3)
            seen.append(tuple(int(result.as_numpy(n)[0, 0]) for n in ("OUTPUT", "START_OUT", "CORRID_OUT")))
        return seen

    results = in_threads(*[partial(run, base + k) for k in range(1, 5)])
    for k, seen in enumerate(results, start=1):
        assert seen == [(100 + k * (i + 1), int(i == 0), base + k) for i in range(4)], seen
    after = _batch_sizes(server, "acc_onnx")
    grown = {size: count - before.get(size, 0) for size, count in after.items() if count > before.get(size, 0)}
    assert sum(size * count for size, count in grown.items()) == 16 and max(grown) > 1, grown

