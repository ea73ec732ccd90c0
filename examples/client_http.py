"""Example HTTP client for the bundled model repository (works against naiad or Triton itself).

    python examples/prepare.py                      # write the ONNX files once
    naiad serve --model-repository examples/models  # or: tritonserver --model-repository ...
    python examples/client_http.py [--url localhost:8000]

Calls ``simple`` version 1 and version 2 (whose outputs are swapped), then embeds three
sentences with ``minilm`` and prints their cosine similarities.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
from tokenizers import Tokenizer

TOKENIZER = Path(__file__).resolve().parent / "models" / "minilm" / "tokenizer.json"
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
]


def call_simple(client: httpclient.InferenceServerClient, version: str) -> tuple[np.ndarray, np.ndarray]:
    """Send one batch of two INT32[16] vectors to ``simple`` and return (OUTPUT0, OUTPUT1)."""
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", inputs, model_version=version, outputs=outputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def tokenize(texts: list[str], tokenizer_path: Path = TOKENIZER) -> dict[str, np.ndarray]:
    """Tokenize like sentence-transformers does (max 256 tokens), padded to the longest text."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding()  # pad to the longest sequence in the batch, not to a fixed 128
    encodings = tokenizer.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def embed(client: httpclient.InferenceServerClient, texts: list[str]) -> np.ndarray:
    """L2-normalised sentence embeddings ``[len(texts), 384]`` from the ``minilm`` model."""
    inputs = []
    for name, array in tokenize(texts).items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput("sentence_embedding", binary_data=True)]
    return client.infer("minilm", inputs, outputs=outputs).as_numpy("sentence_embedding")


def main() -> None:
    """Run the demo against a server at ``--url``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="localhost:8000", help="server HTTP address (default: %(default)s)")
    args = parser.parse_args()
    client = httpclient.InferenceServerClient(url=args.url)
    if not client.is_server_ready():
        raise SystemExit(f"server at {args.url} is not ready")

    for version in ("1", "2"):
        out0, out1 = call_simple(client, version)
        print(f"simple v{version}: OUTPUT0={out0[0].tolist()}")
        print(f"{'':11}OUTPUT1={out1[0].tolist()}")

    emb = embed(client, SENTENCES)
    sims = emb @ emb.T  # embeddings are unit length, so dot product == cosine similarity
    for i, j in ((0, 1), (0, 2), (1, 2)):
        print(f"cosine({SENTENCES[i]!r}, {SENTENCES[j]!r}) = {sims[i, j]:.4f}")


if __name__ == "__main__":
    main()
