"""The inference path with tritonclient.http.aio: datatypes, errors and many concurrent requests
that each check their own answer. Coroutines run under asyncio.run (no pytest-asyncio)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from e2e.infer_models import DATATYPES, assert_serves, identity_name, sample
from e2e.infer_models import infer_server as infer_server  # the fixture

pytestmark = pytest.mark.e2e

Client = aioclient.InferenceServerClient


def _run(url: str, body: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        client = aioclient.InferenceServerClient(url, conn_timeout=30.0)
        try:
            await asyncio.wait_for(body(client), timeout=60)
        finally:
            await client.close()

    asyncio.run(main())


def _input(name: str, data: np.ndarray, datatype: str, binary: bool = True) -> aioclient.InferInput:
    tensor = aioclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


async def _identity(client: Client, datatype: str, data: np.ndarray, binary_in: bool, binary_out: bool) -> None:
    outputs = [aioclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)]
    result = await client.infer(identity_name(datatype), [_input("INPUT0", data, datatype, binary_in)],
                                outputs=outputs)
    got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        items = [s.encode() for s in got.flat] if not binary_out else list(got.flat)
        assert items == list(data.flat)
    elif datatype == "BF16":
        assert got.dtype == ml_dtypes.bfloat16
        assert got.view(np.uint16).tolist() == data.view(np.uint16).tolist()
    else:
        assert got.dtype == data.dtype and got.tolist() == data.tolist()


def test_aio_every_datatype(infer_server: Any) -> None:
    async def body(client: Client) -> None:
        calls = []
        for datatype in DATATYPES:
            data = sample(datatype, (2, 3))
            for binary_in in (True, False):
                if datatype == "BF16" and not binary_in:
                    continue
                calls += [_identity(client, datatype, data, binary_in, out) for out in (True, False)]
        await asyncio.gather(*calls)

    _run(infer_server.url, body)


def test_aio_version_routing_and_request_id(infer_server: Any) -> None:
    async def body(client: Client) -> None:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 4, dtype=np.int32)
        inputs = [_input("INPUT0", a, "INT32"), _input("INPUT1", b, "INT32")]
        for version, first in (("1", a + b), ("2", a - b), ("", a - b)):
            result = await client.infer("simple", inputs, model_version=version, request_id=f"v{version}")
            response = result.get_response()
            assert (response["model_version"], response["id"]) == (version or "2", f"v{version}")
            assert result.as_numpy("OUTPUT0").tolist() == first.tolist()

    _run(infer_server.url, body)


def test_aio_errors_keep_status_and_message(infer_server: Any) -> None:
    async def body(client: Client) -> None:
        data = np.ones((1, 2), np.float32)
        cases = [
            ("nope", "FP32", "404", "Request for unknown model: 'nope' is not found"),
            ("id_int32", "FP32", "400",
             "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'FP32', but model 'id_int32' "
             "expects 'INT32'"),
        ]
        for model, datatype, status, message in cases:
            with pytest.raises(InferenceServerException) as caught:
                await client.infer(model, [_input("INPUT0", data, datatype)])
            assert (caught.value.status(), caught.value.message()) == (status, message)
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("simple", [_input("INPUT0", data, "FP32")], model_version="7")
        assert (caught.value.status(), caught.value.message()) == (
            "404", "Request for unknown model: 'simple' version 7 is not found")

    _run(infer_server.url, body)
    assert_serves(infer_server.url)


async def _identity_checked(client: Client, i: int) -> None:
    data = np.full((1 + i % 8, 1 + i % 11), float(i), dtype=np.float32)
    outputs = [aioclient.InferRequestedOutput("OUTPUT0", binary_data=i % 3 != 0)]
    result = await client.infer("id_fp32", [_input("INPUT0", data, "FP32", binary=i % 2 == 0)],
                                outputs=outputs, request_id=str(i))
    assert result.get_response()["id"] == str(i)
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


async def _simple_checked(client: Client, i: int) -> None:
    a = (np.arange(16, dtype=np.int32) * i).reshape(1, 16)
    b = np.full((1, 16), i % 13, dtype=np.int32)
    version = "1" if i % 2 else "2"
    result = await client.infer("simple", [_input("INPUT0", a, "INT32"), _input("INPUT1", b, "INT32")],
                                model_version=version)
    plus, minus = (a + b).tolist(), (a - b).tolist()
    expected = (plus, minus) if version == "1" else (minus, plus)
    assert (result.as_numpy("OUTPUT0").tolist(), result.as_numpy("OUTPUT1").tolist()) == expected


async def _strings_checked(client: Client, i: int) -> None:
    a = np.array([[str(i + k).encode() for k in range(16)]], dtype=np.object_)
    b = np.array([[str(k).encode() for k in range(16)]], dtype=np.object_)
    result = await client.infer("simple_string", [_input("INPUT0", a, "BYTES"), _input("INPUT1", b, "BYTES")])
    assert result.as_numpy("OUTPUT0").tolist() == [[str(i + 2 * k).encode() for k in range(16)]]
    assert result.as_numpy("OUTPUT1").tolist() == [[str(i).encode()] * 16]


def test_aio_many_concurrent_requests(infer_server: Any) -> None:
    async def body(client: Client) -> None:
        kinds = (_identity_checked, _simple_checked, _strings_checked)
        await asyncio.gather(*(kinds[i % 3](client, i) for i in range(240)))

    _run(infer_server.url, body)


def test_aio_concurrent_good_and_bad_requests(infer_server: Any) -> None:
    async def bad(client: Client, i: int) -> None:
        data = np.ones((9, 1), np.float32)  # over max_batch_size 8
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("id_fp32", [_input("INPUT0", data, "FP32")], request_id=f"bad{i}")
        assert caught.value.message() == f"[request id: bad{i}] inference request batch-size must be <= 8 for 'id_fp32'"

    async def body(client: Client) -> None:
        await asyncio.gather(*((bad if i % 4 == 0 else _identity_checked)(client, i) for i in range(120)))

    _run(infer_server.url, body)
