"""Streaming voice-activity detection (the example repository's `silero_vad`, silero VAD v6 from
its wheel behind the sequence batcher with implicit state), served by a real naiad and fed by
tritonclient chunk by chunk: speech synthesized offline by espeak-ng is placed between known
stretches of silence, and the detected segment must start and end within 100 ms of where the
speech was put. The server's probabilities must also equal silero run in-process the way its
own OnnxWrapper runs it (state and 64-sample context carried by the client)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from client_vad import CHUNK, SAMPLE_RATE, probabilities, speech_segments
from conftest import ServerProcess, running_server
from e2e.concurrency import in_threads
from speech import synthesize
from vad_model import SILERO_PIP_NAME, build_streaming_vad, silero_onnx

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXT = "Voice activity detection finds the stretch of audio where somebody is talking."
LEAD_S, TAIL_S = 1.5, 1.2
TOLERANCE_S = 0.1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    assert silero_onnx() is not None, f"pip install --no-deps {SILERO_PIP_NAME} (make install does)"
    repo = EXAMPLES / "models"
    subprocess.run([sys.executable, str(EXAMPLES / "prepare.py"), "--repo", str(repo)], check=True)
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit", "--load-model", "silero_vad"]
    with running_server(args, tmp_path_factory.mktemp("vad") / "naiad.log") as running:
        yield running


@pytest.fixture(scope="module")
def placed() -> tuple[np.ndarray, float, float]:
    """Speech between stretches of digital silence, and where the speech really is (its first and
    last sample above 2 % of its peak: espeak-ng adds a few ms of near-silence at both ends)."""
    speech = synthesize(TEXT)
    loud = np.nonzero(np.abs(speech) > 0.02 * np.abs(speech).max())[0]
    lead = np.zeros(int(LEAD_S * SAMPLE_RATE), dtype=np.float32)
    tail = np.zeros(int(TAIL_S * SAMPLE_RATE), dtype=np.float32)
    audio = np.concatenate([lead, speech, tail])
    return audio, (lead.size + loud[0]) / SAMPLE_RATE, (lead.size + loud[-1]) / SAMPLE_RATE


def _reference(audio: np.ndarray) -> np.ndarray:
    """silero in-process on its original file, carrying state and context as its OnnxWrapper does."""
    session = ort.InferenceSession(str(silero_onnx()), providers=["CPUExecutionProvider"])
    state, context = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32)
    padded = np.zeros(-(-audio.size // CHUNK) * CHUNK, dtype=np.float32)
    padded[: audio.size] = audio
    found = []
    for chunk in padded.reshape(-1, 1, CHUNK):
        x = np.concatenate([context, chunk], axis=1)
        out, state = session.run(None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)})
        context = x[:, -64:]
        found.append(float(out[0, 0]))
    return np.array(found)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_detected_speech_matches_where_it_was_placed(server: ServerProcess, placed: tuple, protocol: str) -> None:
    audio, start, end = placed
    url = server.grpc_url if protocol == "grpc" else server.url
    probs = probabilities(protocol, url, audio)
    segments = speech_segments(probs)
    assert len(segments) == 1, (segments, start, end)
    detected_start, detected_end = segments[0]
    assert abs(detected_start - start) <= TOLERANCE_S, (detected_start, start)
    assert abs(detected_end - end) <= TOLERANCE_S, (detected_end, end)
    assert probs[: int((start - 0.2) / (CHUNK / SAMPLE_RATE))].max() < 0.5  # the lead-in stays silent
    np.testing.assert_allclose(probs, _reference(audio), atol=1e-4)


def test_concurrent_streams_keep_their_own_state(server: ServerProcess, placed: tuple) -> None:
    """Three streams at once on two instances (one waits in the backlog): each one's answers are
    exactly what it gets alone, and string sequence IDs work as well as numbers."""
    audio, _, _ = placed
    clips = [audio, audio[::-1].copy(), np.concatenate([audio[SAMPLE_RATE:], audio[:SAMPLE_RATE]])]
    ids = [11, "stream-b", 13]
    results = in_threads(*[partial(probabilities, "grpc", server.grpc_url, clip, sid)
                           for clip, sid in zip(clips, ids, strict=True)])
    for clip, result in zip(clips, results, strict=True):
        assert not isinstance(result, Exception), result
        np.testing.assert_allclose(result, _reference(clip), atol=1e-4)


def test_wrapper_graph_carries_the_context_as_a_state(tmp_path: Path) -> None:
    """The wrapped graph takes a bare chunk plus the context and state, and returns the next
    context: exactly silero's own chunk-with-context step."""
    path = build_streaming_vad(tmp_path / "model.onnx", silero_onnx())
    wrapped = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in wrapped.get_inputs()] == [
        ("audio", [1, CHUNK]), ("state", [2, "batch", 128]), ("context", [1, 64])]
    assert [o.name for o in wrapped.get_outputs()] == ["output", "stateN", "contextN"]
    audio = np.random.default_rng(3).normal(0, 0.1, CHUNK * 6).astype(np.float32)
    state, context, found = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
    for chunk in audio.reshape(-1, 1, CHUNK):
        out, state, context = wrapped.run(None, {"audio": chunk, "state": state, "context": context})
        found.append(float(out[0, 0]))
        np.testing.assert_array_equal(context, chunk[:, -64:])
    np.testing.assert_allclose(found, _reference(audio), atol=1e-6)


def test_speech_segments_hysteresis_and_minimum_silence() -> None:
    chunk_s = CHUNK / SAMPLE_RATE
    short_gap = [0.0] * 5 + [0.9] * 10 + [0.1] * 3 + [0.9] * 10 + [0.0] * 20  # 96 ms gap: one segment
    assert speech_segments(np.array(short_gap)) == [(5 * chunk_s, 28 * chunk_s)]
    wobble = [0.9] * 10 + [0.4] * 20 + [0.0] * 10  # 0.4 is above threshold - 0.15: still speech
    assert speech_segments(np.array(wobble)) == [(0.0, 30 * chunk_s)]
    assert speech_segments(np.array([0.0] * 3 + [0.9] * 8)) == [(3 * chunk_s, 11 * chunk_s)]  # open at the end
    assert speech_segments(np.array([0.9] * 2 + [0.0] * 20)) == []  # 64 ms: shorter than min_speech_s
