"""Sentence embeddings from the ``minilm_embed`` ensemble (works against naiad or Triton itself).

    make examples                                   # or: python examples/prepare.py
    naiad serve --model-repository examples/models
    python examples/client_embeddings.py [--url localhost:8000] [--protocol http|grpc] [SENTENCE ...]

The server does all the work — tokenizer (python) -> MiniLM encoder (onnx) -> mean pooling and
L2 normalisation (python) — so the client sends plain text and gets unit vectors back, then
prints how similar each pair of sentences is.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
]


def connect(protocol: str, url: str) -> tuple[Any, Any]:
    """The tritonclient module for ``protocol`` and a client connected to ``url``."""
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module, module.InferenceServerClient(url=url)


def embed(module: Any, client: Any, sentences: list[str]) -> np.ndarray:
    """L2-normalised embeddings ``[len(sentences), 384]``: TEXT is BYTES ``[batch, 1]``."""
    text = np.array([s.encode("utf-8") for s in sentences], dtype=np.object_).reshape(-1, 1)
    tensor = module.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    return client.infer("minilm_embed", [tensor]).as_numpy("EMBEDDING")


def main() -> None:
    """Embed the sentences given (or three examples) and print their cosine similarities."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sentences", nargs="*", default=SENTENCES, help="sentences to compare")
    parser.add_argument("--protocol", choices=["http", "grpc"], default="http")
    parser.add_argument("--url", help="server address (default: localhost:8000 for http, localhost:8001 for grpc)")
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    module, client = connect(args.protocol, url)
    if not client.is_model_ready("minilm_embed"):
        raise SystemExit(f"minilm_embed is not ready at {url}")

    embeddings = embed(module, client, args.sentences)
    print(f"{len(args.sentences)} embeddings of {embeddings.shape[1]} dimensions")
    similarity = embeddings @ embeddings.T  # unit vectors: dot product == cosine similarity
    for i in range(len(args.sentences)):
        for j in range(i + 1, len(args.sentences)):
            print(f"{similarity[i, j]:+.3f}  {args.sentences[i]!r} ~ {args.sentences[j]!r}")


if __name__ == "__main__":
    main()
