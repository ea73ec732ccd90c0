"""BERT WordPiece tokenization for all-MiniLM-L6-v2 with Hugging Face `tokenizers`.

TEXT BYTES [batch, 1] (UTF-8) -> input_ids, attention_mask, token_type_ids INT64 [batch, seq],
where seq is the longest sentence of that request (truncated at 256 tokens, as
sentence-transformers does) rounded up to a multiple of PAD_MULTIPLE. The requests of one execute
call are encoded together, which lets the Rust tokenizer work on them in parallel, and padded one
request at a time, so a request's shape never depends on the requests it happened to be batched
with.

Why round up: the encoder's dynamic batcher (as Triton's) joins only requests of equal shapes.
Exact lengths scatter one-sentence requests over many shapes (7 to 19 tokens gave 1.5 rows per
encoder run); multiples of 8 leave a few, so the encoder runs large batches. Padding tokens carry
attention mask 0: the encoder ignores them and pooling skips them, so embeddings do not change.
"""

from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

MAX_TOKENS = 256
PAD_MULTIPLE = 8
OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")


class TritonPythonModel:
    def initialize(self, args):
        path = Path(args["model_repository"]) / "tokenizer.json"
        if not path.is_file():
            raise pb_utils.TritonModelException(f"{path} is missing: run examples/prepare.py")
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.tokenizer.no_padding()
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    def execute(self, requests):
        texts, errors = [], []
        for request in requests:
            try:
                texts.append(decode(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()))
                errors.append(None)
            except ValueError as error:
                texts.append([])
                errors.append(pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        flat = [t for request_texts in texts for t in request_texts]
        encodings = iter(self.tokenizer.encode_batch(flat) if flat else [])
        responses = []
        for request_texts, error in zip(texts, errors, strict=True):
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            mine = [next(encodings) for _ in request_texts]
            responses.append(pb_utils.InferenceResponse(output_tensors=self.padded(mine)))
        return responses

    def padded(self, encodings):
        """The three INT64 tensors of one request, padded to its longest encoding, rounded up."""
        longest = max(len(e.ids) for e in encodings)
        width = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE
        arrays = {name: np.zeros((len(encodings), width), np.int64) for name in OUTPUTS}
        arrays["input_ids"][:] = self.pad_id
        for row, e in enumerate(encodings):
            n = len(e.ids)
            arrays["input_ids"][row, :n] = e.ids
            arrays["attention_mask"][row, :n] = e.attention_mask
            arrays["token_type_ids"][row, :n] = e.type_ids
        return [pb_utils.Tensor(name, arrays[name]) for name in OUTPUTS]


def decode(text):
    """The sentences of a TEXT tensor [batch, 1] as str; a clear error for bytes that are not UTF-8."""
    sentences = []
    for row, value in enumerate(text.reshape(-1)):
        raw = value if isinstance(value, bytes) else str(value).encode()
        try:
            sentences.append(raw.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise ValueError(f"TEXT[{row}] is not valid UTF-8: {error}") from None
    return sentences
