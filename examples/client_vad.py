"""Streaming voice-activity detection with the ``silero_vad`` model (naiad or Triton itself).

    make examples                                   # or: python examples/prepare.py
    naiad serve --model-repository examples/models
    python examples/client_vad.py [--url localhost:8001] [--protocol grpc|http] [--wav FILE] [TEXT]

Audio goes to the server as one sequence of 32 ms chunks (512 samples at 16 kHz); the sequence
batcher keeps the model's LSTM state and context between chunks, so each request is just the
chunk and each answer the probability that it holds speech. The client turns probabilities into
speech segments the way silero's own VADIterator does (hysteresis plus a minimum silence).
Without --wav it speaks TEXT with espeak-ng (``pip install espeakng-loader``) between two seconds
of silence, and prints where the speech was placed next to where it was detected.
"""

from __future__ import annotations

import argparse
import queue
import random
import wave
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "silero_vad"
SAMPLE_RATE = 16000
CHUNK = 512  # samples per request: 32 ms
CHUNK_S = CHUNK / SAMPLE_RATE


def probabilities(protocol: str, url: str, audio: np.ndarray, sequence_id: int | str | None = None) -> np.ndarray:
    """One speech probability per 32 ms chunk of `audio` (16 kHz mono float32; the tail is padded
    with silence), sent as one sequence: over a gRPC stream, or request by request over HTTP."""
    padded = np.zeros(-(-audio.size // CHUNK) * CHUNK, dtype=np.float32)
    padded[: audio.size] = audio
    chunks = padded.reshape(-1, 1, CHUNK)
    sequence_id = sequence_id or random.randrange(1, 2**63)
    if protocol == "grpc":
        return _over_stream(url, chunks, sequence_id)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        return np.array([float(client.infer(MODEL, [_input(httpclient, chunk)], sequence_id=sequence_id,
                                            sequence_start=i == 0,
                                            sequence_end=i == len(chunks) - 1).as_numpy("output")[0, 0])
                         for i, chunk in enumerate(chunks)])
    finally:
        client.close()


def _over_stream(url: str, chunks: np.ndarray, sequence_id: int | str) -> np.ndarray:
    import tritonclient.grpc as grpcclient

    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        for i, chunk in enumerate(chunks):  # one stream keeps the order; the server runs them in turn
            client.async_stream_infer(MODEL, [_input(grpcclient, chunk)], request_id=str(i),
                                      sequence_id=sequence_id, sequence_start=i == 0,
                                      sequence_end=i == len(chunks) - 1)
        found = np.zeros(len(chunks))
        for _ in range(len(chunks)):
            answer = answers.get(timeout=60)
            if isinstance(answer, Exception):
                raise answer
            found[int(answer.get_response().id)] = answer.as_numpy("output")[0, 0]
        return found
    finally:
        client.stop_stream()
        client.close()


def _input(module: Any, chunk: np.ndarray) -> Any:
    tensor = module.InferInput("audio", list(chunk.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(chunk, dtype=np.float32))
    return tensor


def speech_segments(probs: np.ndarray, threshold: float = 0.5, min_silence_s: float = 0.25,
                    min_speech_s: float = 0.1) -> list[tuple[float, float]]:
    """(start, end) seconds of speech: it starts at the first chunk at or above `threshold` and
    ends where the probability fell below `threshold - 0.15` and stayed there `min_silence_s`
    (silero's VADIterator rule); segments shorter than `min_speech_s` are dropped."""
    segments: list[tuple[float, float]] = []
    start: float | None = None
    quiet_since: float | None = None
    for i, p in enumerate(probs):
        now = i * CHUNK_S
        if p >= threshold:
            quiet_since = None
            if start is None:
                start = now
        elif start is not None and p < threshold - 0.15:
            quiet_since = now if quiet_since is None else quiet_since
            if now + CHUNK_S - quiet_since >= min_silence_s:
                segments.append((start, quiet_since))
                start = quiet_since = None
    if start is not None:
        segments.append((start, quiet_since if quiet_since is not None else len(probs) * CHUNK_S))
    return [(s, e) for s, e in segments if e - s >= min_speech_s]


def read_wav(path: Path) -> np.ndarray:
    """A 16-bit mono WAV file as float32 at 16 kHz."""
    from speech import resample

    with wave.open(str(path)) as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise SystemExit(f"{path}: expected 16-bit mono audio")
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
        return resample(samples, wav.getframerate(), SAMPLE_RATE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="?", default="Voice activity detection finds where people speak.")
    parser.add_argument("--wav", type=Path, help="a 16-bit mono WAV file to scan instead of synthetic speech")
    parser.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--url", help="server address (default: localhost:8001 for grpc, localhost:8000 for http)")
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    if args.wav:
        audio, placed = read_wav(args.wav), None
    else:
        from speech import synthesize

        speech = synthesize(args.text)
        silence = np.zeros(2 * SAMPLE_RATE, dtype=np.float32)
        audio = np.concatenate([silence, speech, silence])
        placed = (silence.size / SAMPLE_RATE, (silence.size + speech.size) / SAMPLE_RATE)
    probs = probabilities(args.protocol, url, audio)
    print(f"{len(probs)} chunks of 32 ms, {probs.size * CHUNK_S:.2f} s of audio")
    if placed:
        print(f"speech placed at {placed[0]:.3f} s - {placed[1]:.3f} s")
    for start, end in speech_segments(probs):
        print(f"speech detected at {start:.3f} s - {end:.3f} s")


if __name__ == "__main__":
    main()
