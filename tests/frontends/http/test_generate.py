"""The generate extension without a real model: body → InferRequest, responses → flat JSON and
server-sent events, and the chunked writing, through HttpApp and HttpProtocol with a fake core."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import numpy as np
import pytest

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError, NotFound, Status, Unavailable, Unsupported
from naiad.frontends.http.app import HttpApp
from naiad.frontends.http.generate import NOT_ONE_RESPONSE, decode_generate_request, encode_generate_response
from naiad.frontends.http.protocol import Connections, HttpProtocol
from naiad.frontends.http.routes import Route, match
from naiad.observability.tracing import Tracer
from naiad.types import DataType, InferRequest, InferResponse, Tensor, TensorSpec

# Like Triton's qa mock_llm: two required [1,1] inputs and an optional one.
MOCK_LLM = [
    TensorSpec("PROMPT", DataType.BYTES, (1, 1)),
    TensorSpec("STREAM", DataType.BOOL, (1, 1)),
    TensorSpec("input_ids", DataType.INT32, (1, -1), optional=True),
]


def _decode(body: Any, inputs: list[TensorSpec] = MOCK_LLM) -> InferRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return decode_generate_request(raw, inputs, "mock_llm", None)


def _error(body: Any, inputs: list[TensorSpec] = MOCK_LLM) -> NaiadError:
    with pytest.raises(NaiadError) as caught:
        _decode(body, inputs)
    return caught.value


def _inputs(request: InferRequest) -> dict[str, tuple[tuple[int, ...], list[Any]]]:
    return {t.name: (t.shape, t.data.ravel().tolist()) for t in request.inputs}


# --------------------------------------------------------------------------------------- routes


@pytest.mark.parametrize(("path", "route"), [
    ("/v2/models/m/generate", Route("model_generate", "m")),
    ("/v2/models/m/generate_stream", Route("model_generate_stream", "m")),
    ("/v2/models/m/versions/3/generate_stream", Route("model_generate_stream", "m", 3)),
])
def test_routes(path: str, route: Route) -> None:
    assert match(path) == route


# ------------------------------------------------------------------------------------- requests


def test_input_keys_become_tensors_padded_to_the_input_dims() -> None:
    request = _decode({"PROMPT": "hello", "STREAM": True, "input_ids": [1, 2, 3]})
    assert _inputs(request) == {"PROMPT": ((1, 1), [b"hello"]), "STREAM": ((1, 1), [True]),
                                "input_ids": ((1, 3), [1, 2, 3])}
    assert [t.datatype for t in request.inputs] == [DataType.BYTES, DataType.BOOL, DataType.INT32]
    assert request.inputs[2].data.dtype == np.int32
    assert request.model_name == "mock_llm" and request.parameters == {} and request.id == ""


@pytest.mark.parametrize(("shape", "value", "expected"), [
    ((-1, -1), 7.5, (1, 1)),            # batched, variable dims: the batch dim is 1
    ((-1, -1), [1, 2, 3], (1, 3)),      # the innermost variable dim takes the elements
    ((-1, 1), [1, 2, 3], (3, 1)),       # ... even when that is the batch dim
    ((-1, 2, -1), [1, 2, 3, 4], (1, 2, 2)),
    ((2, 2), [1, 2, 3, 4], (2, 2)),
    ((-1, -1), [], (1, 0)),
])
def test_shapes(shape: tuple[int, ...], value: Any, expected: tuple[int, ...]) -> None:
    request = _decode({"X": value}, [TensorSpec("X", DataType.FP32, shape)])
    assert request.inputs[0].shape == expected == request.inputs[0].data.shape


@pytest.mark.parametrize(("shape", "value"), [((-1, 2), [1, 2, 3]), ((2, 2), [1, 2]), ((1,), [])])
def test_elements_that_do_not_fit_the_dims(shape: tuple[int, ...], value: Any) -> None:
    error = _error({"X": value}, [TensorSpec("X", DataType.FP32, shape)])
    assert isinstance(error, InvalidArgument)
    assert error.message == "The schema can not convert input 'X' to tensor with proper shape"


def test_id_parameters_and_other_keys() -> None:
    request = _decode({"id": "r1", "PROMPT": "a", "temperature": 0.5, "n": 3,
                       "parameters": {"STREAM": False, "stop": "x", "greedy": True}})
    assert request.id == "r1"
    # Triton maps `id` like any other key too, so the model also sees it as a parameter.
    assert request.parameters == {"id": "r1", "temperature": 0.5, "n": 3, "stop": "x", "greedy": True}
    assert _inputs(request)["STREAM"] == ((1, 1), [False])  # an input named inside `parameters`


def test_integers_past_int64_become_double_parameters() -> None:
    assert _decode({"big": 2**64}).parameters == {"big": float(2**64)}


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_parameters_of_other_types_are_refused(value: Any) -> None:
    error = _error({"p": value})
    assert isinstance(error, InvalidArgument)
    assert error.message == "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."


def test_errors_inside_parameters_name_the_keyword() -> None:
    assert _error({"parameters": {"p": [1]}}).message == (
        "Converting keyword: 'parameters': parameter 'p' has invalid type. It should be either 'int', 'bool', "
        "or 'string'.")
    assert _error({"parameters": 3}).message == (
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object")
    clash = [TensorSpec("parameters", DataType.INT32, (1,))]
    assert _error({"parameters": {}}, clash).message == (
        "Keyword 'parameters' for nested schema also given as input tensor name")


@pytest.mark.parametrize(("body", "name"), [
    (b'{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}', "PROMPT"),
    (b'{"STREAM": false, "PROMPT": "a", "STREAM": true, "PROMPT": "b"}', "STREAM"),
])
def test_duplicate_inputs(body: bytes, name: str) -> None:
    assert _error(body).message == f"input '{name}' already exists in request"


def test_an_input_given_twice_across_parameters() -> None:
    message = _error({"PROMPT": "a", "parameters": {"PROMPT": "b"}}).message
    assert message == "Converting keyword: 'parameters': input 'PROMPT' already exists in request"


@pytest.mark.parametrize(("body", "message"), [
    ({"PROMPT": 123}, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ({"PROMPT": {"USER": "x"}}, "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ({"STREAM": "false"}, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ({"STREAM": 1}, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ({"input_ids": [1, True]}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"input_ids": [1.5]}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"input_ids": [[1, 2]]}, "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"input_ids": [2**31]}, "Unable to parse 'data': value 2147483648 is out of range for INT32"),
    ({"id": 5}, "Unable to parse 'id': attempt to access JSON non-string as string"),
])
def test_wrong_types(body: dict[str, Any], message: str) -> None:
    error = _error(body)
    assert isinstance(error, InvalidArgument) and error.message == message


def test_numeric_datatypes() -> None:
    specs = [TensorSpec("U8", DataType.UINT8, (-1,)), TensorSpec("F16", DataType.FP16, (-1,)),
             TensorSpec("BF", DataType.BF16, (-1,)), TensorSpec("F64", DataType.FP64, (-1,))]
    request = _decode({"U8": [0, 255], "F16": [1, 0.5], "BF": [1.0, -2], "F64": 3}, specs)
    tensors = {t.name: t.data for t in request.inputs}
    assert tensors["U8"].dtype == np.uint8 and tensors["U8"].tolist() == [0, 255]
    assert tensors["F16"].dtype == np.float16 and tensors["F16"].tolist() == [1.0, 0.5]
    assert tensors["BF"].dtype == np.uint16 and tensors["BF"].tolist() == [0x3F80, 0xC000]  # raw bfloat16 bits
    assert tensors["F64"].tolist() == [3.0]
    assert _error({"U8": [-1]}, specs).message == (
        "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer")
    assert _error({"F16": ["1"]}, specs).message == (
        "Unable to parse 'data': attempt to access JSON non-number as double")


@pytest.mark.parametrize("body", [b"", b"{", b'{"a": 1', b"\xff"])
def test_malformed_json(body: bytes) -> None:
    error = _error(body)
    assert isinstance(error, InvalidArgument)
    assert error.message.startswith("failed to parse the request JSON buffer: ")


def test_a_document_that_is_not_an_object() -> None:
    assert _error(b"[1, 2]").message == "attempt to get members for non-object"


# ------------------------------------------------------------------------------------ responses


def _response(outputs: list[Tensor], parameters: dict[str, Any] | None = None, request_id: str = "",
              final: bool = True, error: Exception | None = None) -> InferResponse:
    return InferResponse("m", "1", request_id, outputs, parameters or {}, error, final)


def _tensor(name: str, datatype: DataType, values: Any) -> Tensor:
    data = np.array(values, dtype=datatype.numpy)
    return Tensor(name, datatype, data.shape, data)


def test_flat_json_with_single_elements_unwrapped() -> None:
    text = np.empty((1, 1), dtype=object)
    text[0, 0] = "héllo".encode()
    body = encode_generate_response(_response(
        [Tensor("TEXT", DataType.BYTES, (1, 1), text), _tensor("IDS", DataType.INT64, [[1, 2, 3]]),
         _tensor("OK", DataType.BOOL, [True]), _tensor("NONE", DataType.FP32, np.zeros((1, 0)))],
        {"finish": "stop", "tokens": 3}, request_id="r1"))
    assert json.loads(body) == {"IDS": [1, 2, 3], "NONE": [], "OK": True, "TEXT": "héllo", "finish": "stop",
                                "id": "r1", "model_name": "m", "model_version": "1", "tokens": 3}
    assert list(json.loads(body)) == sorted(json.loads(body))  # Triton's map orders the keys


def test_no_id_when_the_request_had_none() -> None:
    assert json.loads(encode_generate_response(_response([]))) == {"model_name": "m", "model_version": "1"}


def test_reserved_fields_then_parameters_win_over_outputs_of_the_same_name() -> None:
    body = encode_generate_response(_response(
        [_tensor("model_name", DataType.INT32, [1]), _tensor("p", DataType.INT32, [2])], {"p": "param"}))
    assert json.loads(body) == {"model_name": "m", "model_version": "1", "p": "param"}


def test_float_outputs() -> None:
    bf16 = np.array([0x3FC0], dtype=np.uint16)  # 1.5
    body = encode_generate_response(_response(
        [_tensor("H", DataType.FP16, [0.5, 2]), Tensor("B", DataType.BF16, (1,), bf16),
         _tensor("N", DataType.FP32, [math.nan, math.inf, -1.0])]))
    assert b'"N":[NaN,Infinity,-1.0]' in body  # literals, as rapidjson writes them, not null
    document = json.loads(body)
    assert document["H"] == [0.5, 2.0] and document["B"] == 1.5


def test_bytes_parameters_are_unsupported() -> None:
    with pytest.raises(Unsupported, match="Response parameter 'blob' has type 'TRITONSERVER_PARAMETER_BYTES'"):
        encode_generate_response(_response([], {"blob": b"x"}))


# ------------------------------------------------------------------ handlers through HttpApp + HttpProtocol


Script = list[InferResponse | Callable[[], Any]]


class FakeCore:
    """Answers `model_inputs` for model "m" and plays `script` from `stream`: responses are yielded,
    callables are awaited (to pause the stream or fail it)."""

    def __init__(self, script: Script, inputs: list[TensorSpec] = MOCK_LLM,
                 submit_error: NaiadError | None = None) -> None:
        self.script = script
        self.inputs = inputs
        self.submit_error = submit_error
        self.requests: list[InferRequest] = []
        self.closed = False
        self.tracer = Tracer()  # as InferenceServer has one: the handlers ask whether tracing is on

    async def loaded(self, name: object) -> None:
        """As InferenceServer.loaded without on-demand loading: nothing to wait for."""

    def model_inputs(self, name: str, version: int | None) -> tuple[list[TensorSpec], int]:
        if name != "m":
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return self.inputs, 0

    async def stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        self.requests.append(request)
        if self.submit_error is not None:
            raise self.submit_error
        try:
            for step in self.script:
                if isinstance(step, InferResponse):
                    yield step
                else:
                    await step()
        except (asyncio.CancelledError, GeneratorExit):
            self.closed = True  # what InferenceServer.stream turns into job.cancelled
            raise


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Connection:
    """One HttpProtocol on a fake transport, serving HttpApp over a FakeCore."""

    def __init__(self, core: FakeCore) -> None:
        self.transport = Transport()
        app = HttpApp(cast(InferenceServer, core), 1 << 20)
        self.protocol = HttpProtocol(app.dispatch, 1 << 20, Connections())
        self.protocol.connection_made(self.transport)

    def post(self, path: str, body: Any, version: bytes = b"1.1") -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.protocol.data_received(b"POST %s HTTP/%s\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                                    % (path.encode(), version, len(raw), raw))

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)


def _parts(data: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, dict(line.split(b": ", 1) for line in lines), body


def _dechunk(body: bytes) -> bytes:
    out = b""
    while True:
        size, _, rest = body.partition(b"\r\n")
        length = int(size, 16)
        if length == 0:
            assert rest == b"\r\n"
            return out
        out += rest[:length]
        assert rest[length:length + 2] == b"\r\n"
        body = rest[length + 2:]


def _serve(core: FakeCore, path: str, body: Any) -> tuple[bytes, dict[bytes, bytes], bytes]:
    async def main() -> bytes:
        connection = Connection(core)
        connection.post(path, body)
        await connection.settle()
        return connection.transport.data

    return _parts(asyncio.run(main()))


def _out(value: int, final: bool = False) -> InferResponse:
    return _response([_tensor("OUT", DataType.INT32, [value])], final=final)


FINAL = _response([], final=True)
BODY = {"PROMPT": "hi", "STREAM": True}


def test_generate_answers_the_one_response_as_json() -> None:
    status, headers, body = _serve(FakeCore([_out(7, final=True)]), "/v2/models/m/generate", BODY)
    assert status == b"HTTP/1.1 200 OK" and headers[b"content-type"] == b"application/json"
    assert json.loads(body) == {"OUT": 7, "model_name": "m", "model_version": "1"}


def test_generate_takes_one_response_followed_by_a_flags_only_final() -> None:
    _, _, body = _serve(FakeCore([_out(7), FINAL]), "/v2/models/m/generate", BODY)
    assert json.loads(body)["OUT"] == 7


@pytest.mark.parametrize("script", [[FINAL], [_out(1), _out(2), FINAL]])
def test_generate_refuses_zero_or_many_responses(script: Script) -> None:
    status, headers, body = _serve(FakeCore(script), "/v2/models/m/generate", BODY)
    assert status == b"HTTP/1.1 500 Internal Server Error" and headers[b"content-type"] == b"application/json"
    assert json.loads(body) == {"error": NOT_ONE_RESPONSE}


def test_generate_error_response_keeps_its_status() -> None:
    failed = _response([], error=Unavailable("An Error Occurred"))
    status, _, body = _serve(FakeCore([failed]), "/v2/models/m/generate", BODY)
    assert status.startswith(b"HTTP/1.1 503") and json.loads(body) == {"error": "An Error Occurred"}


def test_stream_sends_each_response_as_an_event_and_nothing_for_the_flags_only_final() -> None:
    core = FakeCore([_out(1), _out(2), FINAL])
    status, headers, body = _serve(core, "/v2/models/m/generate_stream", BODY)
    assert status == b"HTTP/1.1 200 OK"
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"transfer-encoding"] == b"chunked" and b"content-length" not in headers
    events = _dechunk(body)
    assert events == (b'data: {"OUT":1,"model_name":"m","model_version":"1"}\n\n'
                      b'data: {"OUT":2,"model_name":"m","model_version":"1"}\n\n')
    assert core.requests[0].inputs[0].name == "PROMPT"


def test_stream_of_a_model_with_one_response() -> None:
    _, _, body = _serve(FakeCore([_out(5, final=True)]), "/v2/models/m/versions/1/generate_stream", BODY)
    assert _dechunk(body) == b'data: {"OUT":5,"model_name":"m","model_version":"1"}\n\n'


def test_stream_with_no_response_at_all_is_an_empty_200() -> None:
    status, _, body = _serve(FakeCore([FINAL]), "/v2/models/m/generate_stream", BODY)
    assert status == b"HTTP/1.1 200 OK" and _dechunk(body) == b""


def test_an_error_mid_stream_is_an_event_and_the_status_stays_200() -> None:
    failed = _response([], error=InternalError("An Error Occurred"))
    status, _, body = _serve(FakeCore([_out(1), failed]), "/v2/models/m/generate_stream", BODY)
    assert status == b"HTTP/1.1 200 OK"
    assert _dechunk(body).split(b"\n\n")[1] == b'data: {"error":"An Error Occurred"}'


def test_an_error_as_first_response_sets_the_status_of_the_stream() -> None:
    failed = _response([], error=Unavailable("An Error Occurred"))
    status, headers, body = _serve(FakeCore([failed]), "/v2/models/m/generate_stream", BODY)
    assert status.startswith(b"HTTP/1.1 503")
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert _dechunk(body) == b'data: {"error":"An Error Occurred"}\n\n'


def test_an_output_that_cannot_be_encoded_is_an_error_event() -> None:
    odd = _response([_tensor("OUT", DataType.INT32, [1])], {"blob": b"x"}, final=True)
    _, _, body = _serve(FakeCore([odd]), "/v2/models/m/generate_stream", BODY)
    assert json.loads(_dechunk(body).removeprefix(b"data: "))["error"].startswith("Response parameter 'blob'")


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("path", "body", "core", "status", "message"), [
    ("/v2/models/nope/{}", BODY, FakeCore([]), 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/m/{}", b"{oops", FakeCore([]), 400, "failed to parse the request JSON buffer: "),
    ("/v2/models/m/{}", {"PROMPT": 1}, FakeCore([]), 400, "Unable to parse JSON bytes array"),
    ("/v2/models/m/{}", {}, FakeCore([], submit_error=InvalidArgument("expected 2 inputs but got 0 inputs")),
     400, "expected 2 inputs but got 0 inputs"),
])
def test_errors_before_inference_are_plain_json(route: str, path: str, body: Any, core: FakeCore, status: int,
                                                message: str) -> None:
    line, headers, answer = _serve(core, path.format(route), body)
    assert line.startswith(b"HTTP/1.1 %d" % status)
    assert headers[b"content-type"] == b"application/json" and b"content-length" in headers
    assert json.loads(answer)["error"].startswith(message)


def test_wrong_method() -> None:
    async def main() -> bytes:
        connection = Connection(FakeCore([]))
        connection.protocol.data_received(b"GET /v2/models/m/generate_stream HTTP/1.1\r\nHost: x\r\n\r\n")
        await connection.settle()
        return connection.transport.data

    assert _parts(asyncio.run(main()))[0] == b"HTTP/1.1 405 Method Not Allowed"


def test_events_are_written_as_they_arrive() -> None:
    release = asyncio.Event()

    async def main() -> None:
        core = FakeCore([_out(1), release.wait, _out(2), FINAL])
        connection = Connection(core)
        connection.post("/v2/models/m/generate_stream", BODY)
        await connection.settle()
        assert b'"OUT":1' in connection.transport.data and b'"OUT":2' not in connection.transport.data
        assert not connection.transport.data.endswith(b"0\r\n\r\n")  # not finished yet
        release.set()
        await connection.settle()
        assert b'"OUT":2' in connection.transport.data and connection.transport.data.endswith(b"0\r\n\r\n")
        assert not connection.transport.closed  # keep-alive: the next request may follow

    asyncio.run(main())


def test_a_client_that_goes_away_cancels_the_request() -> None:
    async def main() -> None:
        core = FakeCore([_out(1), asyncio.Event().wait, _out(2), FINAL])
        connection = Connection(core)
        connection.post("/v2/models/m/generate_stream", BODY)
        await connection.settle()
        assert b'"OUT":1' in connection.transport.data and not core.closed
        connection.protocol.connection_lost(None)
        await connection.settle()
        assert core.closed

    asyncio.run(main())


def test_a_client_that_goes_away_before_the_first_response_cancels_too() -> None:
    async def main() -> None:
        core = FakeCore([asyncio.Event().wait, _out(1), FINAL])
        connection = Connection(core)
        connection.post("/v2/models/m/generate", BODY)
        await connection.settle()
        connection.protocol.connection_lost(None)
        await connection.settle()
        assert core.closed and connection.transport.data == b""

    asyncio.run(main())


def test_a_slow_reader_holds_the_stream_back() -> None:
    release = asyncio.Event()

    async def main() -> None:
        core = FakeCore([release.wait, _out(1), _out(2), FINAL])
        connection = Connection(core)
        connection.post("/v2/models/m/generate_stream", BODY)
        await connection.settle()
        connection.protocol.pause_writing()  # as asyncio does when the write buffer is full
        release.set()
        await connection.settle()
        assert b"200 OK" in connection.transport.data and b'"OUT"' not in connection.transport.data
        connection.protocol.resume_writing()
        await connection.settle()
        assert connection.transport.data.count(b'"OUT"') == 2

    asyncio.run(main())


def test_http_1_0_gets_the_events_unchunked_and_a_closed_connection() -> None:
    async def main() -> bytes:
        connection = Connection(FakeCore([_out(1), FINAL]))
        connection.post("/v2/models/m/generate_stream", BODY, version=b"1.0")
        await connection.settle()
        assert connection.transport.closed
        return connection.transport.data

    _, headers, body = _parts(asyncio.run(main()))
    assert b"transfer-encoding" not in headers and headers[b"connection"] == b"close"
    assert body == b'data: {"OUT":1,"model_name":"m","model_version":"1"}\n\n'


def test_a_broken_stream_cuts_the_body_short() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    async def main() -> Transport:
        connection = Connection(FakeCore([_out(1), fail]))
        connection.post("/v2/models/m/generate_stream", BODY)
        await connection.settle()
        return connection.transport

    transport = asyncio.run(main())
    assert transport.closed and b'"OUT":1' in transport.data and not transport.data.endswith(b"0\r\n\r\n")


def test_error_statuses_of_response_errors() -> None:
    # The status of the first response decides the stream's status, with the usual mapping.
    for error, status in ((InvalidArgument("x"), 400), (NaiadError("x", Status.UNSUPPORTED), 501)):
        line, _, _ = _serve(FakeCore([_response([], error=error)]), "/v2/models/m/generate_stream", BODY)
        assert line.startswith(b"HTTP/1.1 %d" % status)
