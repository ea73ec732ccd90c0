"""The PyTorch backend with real torch models: silero VAD's TorchScript file against the wheel's
own model, Triton's naming rules, its config parameters, and every load and request failure."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tritonclient.grpc import model_config_pb2 as mc  # noqa: E402

from naiad.backends.base import Batch  # noqa: E402
from naiad.backends.blocking import execute_blocking  # noqa: E402
from naiad.backends.pytorch import PyTorchModel  # noqa: E402
from naiad.backends.pytorch_settings import parse_settings  # noqa: E402
from naiad.config.autocomplete import resolve_backend  # noqa: E402
from naiad.config.model_config import parse_config_text  # noqa: E402
from naiad.errors import InternalError, InvalidArgument, Unavailable  # noqa: E402
from naiad.types import DataType, InferRequest, Tensor  # noqa: E402

CPU = mc.ModelInstanceGroup(kind=mc.ModelInstanceGroup.KIND_CPU)


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Named(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": a + b, "diff": a - b}


class DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] - inputs["b"]


class ListInput(torch.nn.Module):
    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return inputs[0]


class GradMode(torch.nn.Module):
    """Reports whether it ran under torch.inference_mode (an inference tensor) and grad mode."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        return y, torch.tensor([y.is_inference(), torch.is_grad_enabled()])


class Arithmetic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1) * 3


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, factor: int) -> torch.Tensor:
        if factor < 0:
            raise ValueError("factor must not be negative")
        return x * factor


class Widen(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def _version(tmp_path: Path, module: torch.nn.Module | None = None, filename: str = "model.pt") -> Path:
    version = tmp_path / "1"
    version.mkdir(parents=True, exist_ok=True)
    if module is not None:
        torch.jit.script(module).save(str(version / filename))
    return version


def _config(body: str, name: str = "m", backend: str = "pytorch") -> mc.ModelConfig:
    return parse_config_text(f'name: "{name}" backend: "{backend}" {body}', "test")


def _io(kind: str, name: str, datatype: str = "TYPE_FP32", dims: str = "[ -1 ]") -> str:
    return f'{kind} {{ name: "{name}" data_type: {datatype} dims: {dims} }} '


def _params(**values: str) -> str:
    return "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }} ' for k, v in values.items())


def _run(instance, **inputs: np.ndarray) -> list:
    tensors = [Tensor(name, DataType.from_numpy(a.dtype), a.shape, a) for name, a in inputs.items()]
    return instance.execute(Batch([InferRequest("m", None, tensors)], batched=True))


def _instance(version: Path, body: str, group: mc.ModelInstanceGroup = CPU):
    return PyTorchModel(_config(body), version, 1).create_instance(group, 0)


# --- silero VAD -------------------------------------------------------------------------------


def _speechlike(seconds: float = 3.0, rate: int = 16000) -> np.ndarray:
    """Voiced bursts (harmonics of a gliding pitch under a syllable envelope) between quiet noise."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    pitch = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12))
    syllables = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) * (t % 1.5 < 0.9)
    audio = 0.3 * voiced * syllables + 0.01 * rng.standard_normal(t.size)
    return audio[: audio.size - audio.size % 512].astype(np.float32)


# forward(x: Tensor, sr: int): inputs bind by argument name; sr arrives as a one-element tensor
SILERO_IO = (_io("input", "x", dims="[ 1, 512 ]") + _io("input", "sr", "TYPE_INT64", "[ 1 ]")
             + _io("output", "speech", dims="[ 1, 1 ]"))


def _silero_version(tmp_path: Path) -> Path:
    pytest.importorskip("silero_vad")
    import importlib.resources

    version = _version(tmp_path)
    shutil.copy(str(importlib.resources.files("silero_vad.data").joinpath("silero_vad.jit")), version / "model.pt")
    return version


def _wheel_probabilities(chunks: np.ndarray) -> list[float]:
    """The wheel's own call pattern (get_speech_timestamps): reset, then 512-sample windows in order.
    The model keeps its recurrent state and context between calls (reset by reset_states(), or by
    a change of batch size or sampling rate), so a fresh naiad instance fed the same windows in
    the same order must agree."""
    import silero_vad

    direct = silero_vad.load_silero_vad()
    direct.reset_states()
    return [direct(torch.from_numpy(chunk), 16000).item() for chunk in chunks]


def test_silero_vad_gives_the_wheels_speech_probabilities(tmp_path: Path) -> None:
    instance = _instance(_silero_version(tmp_path), SILERO_IO)
    chunks = _speechlike().reshape(-1, 512)
    expected = _wheel_probabilities(chunks)
    sr = np.array([16000], dtype=np.int64)
    got = []
    for chunk in chunks:
        tensors = [Tensor("x", DataType.FP32, (1, 512), chunk[None]), Tensor("sr", DataType.INT64, (1,), sr)]
        (result,) = instance.execute(Batch([InferRequest("silero", None, tensors)], batched=False))
        got.append(float(result["speech"].item()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert max(expected) > 0.5 > min(expected)  # the audio has speech-like and quiet windows


@pytest.mark.e2e
def test_silero_vad_served_over_http_matches_the_wheel(tmp_path: Path) -> None:
    import tritonclient.http as httpclient
    from conftest import running_server

    repo = tmp_path / "repo"
    _silero_version(repo / "silero")
    (repo / "silero" / "config.pbtxt").write_text(f'backend: "pytorch" {SILERO_IO}')
    chunks = _speechlike(1.5).reshape(-1, 512)
    expected = _wheel_probabilities(chunks)
    args = ["--model-repository", str(repo)]
    with running_server(args, tmp_path / "naiad.log") as server, \
            httpclient.InferenceServerClient(server.url) as client:
        assert client.get_model_metadata("silero")["platform"] == "pytorch_libtorch"
        got = []
        for chunk in chunks:
            x, sr = httpclient.InferInput("x", [1, 512], "FP32"), httpclient.InferInput("sr", [1], "INT64")
            x.set_data_from_numpy(chunk[None])
            sr.set_data_from_numpy(np.array([16000], dtype=np.int64))
            got.append(float(client.infer("silero", [x, sr]).as_numpy("speech").item()))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- naming -------------------------------------------------------------------------------------


def test_indexed_names_bind_by_position_whatever_the_config_order(tmp_path: Path) -> None:
    version = _version(tmp_path, AddSub())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__1") + _io("input", "INPUT__0")
                         + _io("output", "OUTPUT__1") + _io("output", "OUTPUT__0"))
    a, b = np.array([[5.0, 7.0]], dtype=np.float32), np.array([[1.0, 2.0]], dtype=np.float32)
    (result,) = _run(instance, INPUT__0=a, INPUT__1=b)
    assert result["OUTPUT__0"].tolist() == [[6.0, 9.0]] and result["OUTPUT__1"].tolist() == [[4.0, 5.0]]


def test_forward_argument_names_and_dict_keys_bind_by_name(tmp_path: Path) -> None:
    version = _version(tmp_path, Named())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "b") + _io("input", "a")
                         + _io("output", "diff") + _io("output", "sum"))
    (result,) = _run(instance, a=np.array([[5.0]], dtype=np.float32), b=np.array([[1.0]], dtype=np.float32))
    assert result["diff"].tolist() == [[4.0]] and result["sum"].tolist() == [[6.0]]


def test_other_names_bind_in_config_order(tmp_path: Path) -> None:
    version = _version(tmp_path, AddSub())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "first") + _io("input", "second")
                         + _io("output", "plus") + _io("output", "minus"))
    (result,) = _run(instance, first=np.array([[5.0]], dtype=np.float32), second=np.array([[1.0]], dtype=np.float32))
    assert result["plus"].tolist() == [[6.0]] and result["minus"].tolist() == [[4.0]]


def test_a_single_dict_argument_takes_the_inputs_by_name(tmp_path: Path) -> None:
    version = _version(tmp_path, DictInput())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "b") + _io("input", "a")
                         + _io("output", "OUTPUT__0"))
    (result,) = _run(instance, a=np.array([[5.0]], dtype=np.float32), b=np.array([[1.0]], dtype=np.float32))
    assert result["OUTPUT__0"].tolist() == [[4.0]]


def test_forward_argument_types_it_cannot_feed_are_refused(tmp_path: Path) -> None:
    version = _version(tmp_path, ListInput())
    with pytest.raises(InvalidArgument, match=r"argument 'inputs' has type List\[Tensor\]"):
        _instance(version, _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))


def test_a_batch_of_requests_is_split_back(tmp_path: Path) -> None:
    version = _version(tmp_path, AddSub())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0") + _io("input", "INPUT__1")
                         + _io("output", "OUTPUT__0"))
    requests = []
    for value in (1.0, 2.0):
        a = np.full((1, 2), value, dtype=np.float32)
        requests.append(InferRequest("m", None, [Tensor("INPUT__0", DataType.FP32, a.shape, a),
                                                 Tensor("INPUT__1", DataType.FP32, a.shape, a)]))
    results = instance.execute(Batch(requests, batched=True))
    assert [r["OUTPUT__0"].tolist() for r in results] == [[[2.0, 2.0]], [[4.0, 4.0]]]


def test_bf16_passes_raw_bits(tmp_path: Path) -> None:
    version = _version(tmp_path, Arithmetic())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0", "TYPE_BF16")
                         + _io("output", "OUTPUT__0", "TYPE_BF16"))
    bits = np.array([[0x3F80, 0xBF80]], dtype=np.uint16)  # 1.0, -1.0 -> relu(2x + 1) * 3 = 9.0, 0.0
    tensors = [Tensor("INPUT__0", DataType.BF16, bits.shape, bits)]
    (result,) = instance.execute(Batch([InferRequest("m", None, tensors)], batched=True))
    assert result["OUTPUT__0"].dtype == np.uint16 and result["OUTPUT__0"].tolist() == [[0x4110, 0x0000]]


# --- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "inference"), [("true", True), ("false", False)])
def test_inference_mode_parameter_chooses_the_grad_mode(tmp_path: Path, value: str, inference: bool) -> None:
    version = _version(tmp_path, GradMode())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "x") + _io("output", "y")
                         + _io("output", "mode", "TYPE_BOOL") + _params(INFERENCE_MODE=value))
    (result,) = _run(instance, x=np.ones((1, 2), dtype=np.float32))
    assert result["mode"].tolist() == [inference, False]  # no_grad or inference_mode: grad is off either way


@pytest.mark.parametrize(("value", "profiled"), [("false", True), ("true", False)])
def test_disable_optimized_execution_turns_the_jit_optimizer_off(tmp_path: Path, value: str, profiled: bool) -> None:
    version = _version(tmp_path, Arithmetic())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0") + _io("output", "OUTPUT__0")
                         + _params(DISABLE_OPTIMIZED_EXECUTION=value))
    (result,) = _run(instance, INPUT__0=np.ones((1, 2), dtype=np.float32))
    assert result["OUTPUT__0"].tolist() == [[9.0, 9.0]]
    # the optimizing (profiling) executor instruments its first run; the plain interpreter does not
    assert ("prim::profile" in str(torch.jit.last_executed_optimized_graph())) is profiled
    assert torch._C._get_graph_executor_optimize()  # the setting was scoped to the call


@pytest.mark.parametrize(("params", "threads"), [({}, 1), ({"INTRA_OP_THREAD_COUNT": "2"}, 2)])
def test_intra_op_thread_count_applies_to_the_instance_thread(tmp_path: Path, params: dict, threads: int) -> None:
    version = _version(tmp_path, Arithmetic())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0") + _io("output", "OUTPUT__0")
                         + _params(**params))
    seen: list[int] = []

    def serve() -> None:
        _run(instance, INPUT__0=np.ones((1, 2), dtype=np.float32))
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()
    assert seen == [threads]


def test_an_instance_that_served_through_its_thread_closes_cleanly(tmp_path: Path) -> None:
    """The instance's thread count bookkeeping once overwrote the instance thread it runs on
    (found by mypy): close() then called join() on an int."""
    version = _version(tmp_path, Arithmetic())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))
    a = np.ones((1, 2), dtype=np.float32)
    batch = Batch([InferRequest("m", None, [Tensor("INPUT__0", DataType.FP32, a.shape, a)])], batched=True)
    (result,) = execute_blocking(instance, batch)
    assert result["OUTPUT__0"].tolist() == [[9.0, 9.0]]
    thread = instance._thread
    assert isinstance(thread, threading.Thread) and thread.is_alive()
    instance.close()
    assert not thread.is_alive()


@pytest.mark.parametrize(("key", "value"), [("INFERENCE_MODE", "maybe"), ("INTRA_OP_THREAD_COUNT", "0"),
                                            ("INTER_OP_THREAD_COUNT", "two")])
def test_malformed_parameters_are_refused(key: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=key):
        parse_settings(_config(_params(**{key: value})))


def test_triton_switches_without_effect_are_accepted() -> None:
    settings = parse_settings(_config(_params(ENABLE_NVFUSER="true", DISABLE_CUDNN="true", NUM_THREADS="2")))
    assert settings.intra_op_threads == 2 and settings.inference_mode


# --- request failures ---------------------------------------------------------------------------


def test_a_scalar_argument_needs_one_element(tmp_path: Path) -> None:
    version = _version(tmp_path, Scaled())
    instance = _instance(version, _io("input", "x", dims="[ 2 ]") + _io("input", "factor", "TYPE_INT64", "[ -1 ]")
                         + _io("output", "OUTPUT__0", dims="[ 2 ]"))
    x = np.array([1.0, 2.0], dtype=np.float32)
    (result,) = _run(instance, x=x, factor=np.array([3], dtype=np.int64))
    assert result["OUTPUT__0"].tolist() == [3.0, 6.0]
    (error,) = _run(instance, x=x, factor=np.array([3, 4], dtype=np.int64))
    assert isinstance(error, InvalidArgument) and "must hold one element" in str(error)


def test_a_model_that_raises_fails_the_batch_and_serves_on(tmp_path: Path) -> None:
    version = _version(tmp_path, Scaled())
    instance = _instance(version, _io("input", "x", dims="[ 2 ]") + _io("input", "factor", "TYPE_INT64", "[ 1 ]")
                         + _io("output", "OUTPUT__0", dims="[ 2 ]"))
    x = np.array([1.0, 2.0], dtype=np.float32)
    (error,) = _run(instance, x=x, factor=np.array([-1], dtype=np.int64))
    assert isinstance(error, InternalError) and "factor must not be negative" in str(error)
    (result,) = _run(instance, x=x, factor=np.array([2], dtype=np.int64))
    assert result["OUTPUT__0"].tolist() == [2.0, 4.0]


def test_an_output_of_another_type_than_configured_is_an_error(tmp_path: Path) -> None:
    version = _version(tmp_path, Widen())
    instance = _instance(version, "max_batch_size: 4 " + _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))
    (error,) = _run(instance, INPUT__0=np.ones((1, 2), dtype=np.float32))
    assert isinstance(error, InvalidArgument) and "torch.float64, configuration expects TYPE_FP32" in str(error)


# --- load failures ------------------------------------------------------------------------------


def test_a_corrupt_model_pt_fails_to_load_with_the_reason(tmp_path: Path) -> None:
    version = _version(tmp_path)
    (version / "model.pt").write_bytes(b"this is not a TorchScript archive")
    with pytest.raises(InvalidArgument, match=r"unable to load TorchScript model .*model\.pt': .*zip"):
        _instance(version, _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))


def test_a_model_saved_with_torch_save_is_refused_with_a_hint(tmp_path: Path) -> None:
    version = _version(tmp_path)
    torch.save(Arithmetic(), version / "model.pt")
    with pytest.raises(InvalidArgument, match=r"torch\.jit\.script"):
        _instance(version, _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))


def test_kind_gpu_without_cuda_fails_clearly(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: tests/gpu/test_pytorch_cuda.py covers KIND_GPU")
    version = _version(tmp_path, Arithmetic())
    gpu = mc.ModelInstanceGroup(name="m_0", kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[0])
    with pytest.raises(Unavailable, match=r"'m_0' is KIND_GPU but torch .* has no usable CUDA device"):
        _instance(version, _io("input", "INPUT__0") + _io("output", "OUTPUT__0"), gpu)


@pytest.mark.parametrize("missing", ["input", "output"])
def test_torchscript_needs_inputs_and_outputs_in_the_config(tmp_path: Path, missing: str) -> None:
    version = _version(tmp_path, Arithmetic())
    config = _config(_io("output" if missing == "input" else "input", "X"))
    assert not PyTorchModel.auto_complete(config, version, {})  # TorchScript has no signature to read
    with pytest.raises(InvalidArgument, match=f"must contain at least one {missing}, none were specified"):
        PyTorchModel(config, version, 1)


def test_bytes_are_not_supported(tmp_path: Path) -> None:
    version = _version(tmp_path, Arithmetic())
    with pytest.raises(InvalidArgument, match="unsupported datatype TYPE_STRING for input 'INPUT__0'"):
        PyTorchModel(_config(_io("input", "INPUT__0", "TYPE_STRING") + _io("output", "OUTPUT__0")), version, 1)


def test_input_count_must_match_forward(tmp_path: Path) -> None:
    version = _version(tmp_path, AddSub())
    with pytest.raises(InvalidArgument, match="configuration expects 1 inputs, model provides 2"):
        _instance(version, _io("input", "INPUT__0") + _io("output", "OUTPUT__0"))


def test_indexed_inputs_must_number_every_argument(tmp_path: Path) -> None:
    version = _version(tmp_path, AddSub())
    with pytest.raises(InvalidArgument, match="from __0 to __1, each once"):
        _instance(version, _io("input", "INPUT__0") + _io("input", "INPUT__2") + _io("output", "OUTPUT__0"))


def test_missing_model_file(tmp_path: Path) -> None:
    version = _version(tmp_path)
    with pytest.raises(Unavailable, match="unable to find"):
        PyTorchModel(_config(_io("input", "INPUT__0") + _io("output", "OUTPUT__0")), version, 1)


# --- torch.export programs (model.pt2) ----------------------------------------------------------


def _export(version: Path, module: torch.nn.Module, *args: torch.Tensor) -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(module, args, dynamic_shapes=tuple({0: batch} for _ in args))
    torch.export.save(program, str(version / "model.pt2"))


def test_a_pt2_archive_resolves_to_torch_aoti_and_auto_completes(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _export(version, AddSub(), torch.zeros(2, 3), torch.zeros(2, 3))
    config = _config("", backend="")
    resolve_backend(config, tmp_path, version, model_name="m")
    assert (config.backend, config.platform, config.default_model_filename) == ("pytorch", "torch_aoti", "model.pt2")
    assert PyTorchModel.auto_complete(config, version, {"default_max_batch_size": 4})
    assert config.max_batch_size == 4
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT__0", [3]), ("INPUT__1", [3])]
    assert [(o.name, list(o.dims)) for o in config.output] == [("OUTPUT__0", [3]), ("OUTPUT__1", [3])]
    instance = PyTorchModel(config, version, 1).create_instance(CPU, 0)
    a, b = np.full((2, 3), 5.0, dtype=np.float32), np.ones((2, 3), dtype=np.float32)
    (result,) = _run(instance, INPUT__0=a, INPUT__1=b)
    assert result["OUTPUT__0"].tolist() == (a + b).tolist() and result["OUTPUT__1"].tolist() == (a - b).tolist()


def test_pytorch_backend_with_a_pt2_file_takes_its_platform(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _export(version, Arithmetic(), torch.zeros(2, 3))
    config = _config("")
    resolve_backend(config, tmp_path, version, model_name="m")
    assert (config.platform, config.default_model_filename) == ("torch_aoti", "model.pt2")


def test_pt2_forward_names_and_dict_outputs(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _export(version, Named(), torch.zeros(2, 3), torch.zeros(2, 3))
    instance = _instance(version, 'platform: "torch_aoti" max_batch_size: 4 ' + _io("input", "b") + _io("input", "a")
                         + _io("output", "RESULT[diff]") + _io("output", "sum"))
    a, b = np.full((1, 3), 5.0, dtype=np.float32), np.ones((1, 3), dtype=np.float32)
    (result,) = _run(instance, a=a, b=b)
    assert result["RESULT[diff]"].tolist() == [[4.0] * 3] and result["sum"].tolist() == [[6.0] * 3]


def test_pt2_types_must_match_the_config(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _export(version, Arithmetic(), torch.zeros(2, 3))
    with pytest.raises(InvalidArgument, match="TYPE_FP64 for input 'INPUT__0', model provides TYPE_FP32"):
        _instance(version, 'platform: "torch_aoti" max_batch_size: 4 ' + _io("input", "INPUT__0", "TYPE_FP64")
                  + _io("output", "OUTPUT__0"))


def test_pt2_shape_outside_the_exported_range_fails_the_request(tmp_path: Path) -> None:
    version = _version(tmp_path)
    _export(version, Arithmetic(), torch.zeros(2, 3))
    instance = _instance(version, 'platform: "torch_aoti" max_batch_size: 4 ' + _io("input", "INPUT__0")
                         + _io("output", "OUTPUT__0"))
    (error,) = _run(instance, INPUT__0=np.ones((1, 4), dtype=np.float32))
    assert isinstance(error, InternalError) and "PyTorch execute failure" in str(error)


def test_a_corrupt_pt2_fails_to_load_with_the_reason(tmp_path: Path) -> None:
    version = _version(tmp_path)
    (version / "model.pt2").write_bytes(b"not an archive")
    with pytest.raises(InvalidArgument, match=r"unable to load torch\.export program .*model\.pt2'"):
        PyTorchModel.auto_complete(_config('platform: "torch_aoti"'), version, {})


def test_an_aotinductor_package_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Triton's torch_aoti archives hold compiled code, not a program (compiling one takes minutes:
    the archive here has only the layout the refusal looks at)."""
    import zipfile

    version = _version(tmp_path)
    with zipfile.ZipFile(version / "model.pt2", "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/data/aotinductor/model/model.wrapper.so", b"")
    with pytest.raises(InvalidArgument, match=r"AOTInductor-compiled package .* torch\.export\.save"):
        PyTorchModel.auto_complete(_config('platform: "torch_aoti"'), version, {})
