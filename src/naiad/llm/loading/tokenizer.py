"""Text ↔ token ids for the engine: a `tokenizers` tokenizer plus the model's chat template.

Built from a Hugging Face directory (tokenizer.json, tokenizer_config.json) or from a GGUF
file's metadata (its "gpt2" byte-level BPE). No torch here: the serving side tokenizes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

if TYPE_CHECKING:
    from gguf import GGUFReader

# llama.cpp's token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED are added.
_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp pre-tokenizers that split digits one by one before the GPT-2 byte-level regex.
_DIGIT_SPLITTING_PRE = {"smollm", "starcoder", "refact", "codeshell", "command-r"}


#: the variables apply_chat_template gives the template itself (a caller's extra ones may not)
TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


class Tokenizer:
    """Encode, decode, and render chat prompts for one model."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        """From tokenizer.json; the chat template and bos/eos from tokenizer_config.json."""
        model_dir = Path(model_dir)
        tokenizer = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        config_path = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template = config.get("chat_template")
        # transformers 4.43+ may write the template to its own file.
        template_path = model_dir / "chat_template.jinja"
        if template is None and template_path.is_file():
            template = template_path.read_text()
        return cls(tokenizer, template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))

    @classmethod
    def from_gguf(cls, reader: GGUFReader) -> Tokenizer:
        """From a GGUF file's tokenizer.ggml.* metadata (only the "gpt2" BPE kind)."""
        kind = field_value(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"GGUF tokenizer {kind!r} is not supported (only gpt2 byte-level BPE)")
        tokens: list[str] = field_value(reader, "tokenizer.ggml.tokens")
        types: list[int] = field_value(reader, "tokenizer.ggml.token_type", [])
        merges: list[str] = field_value(reader, "tokenizer.ggml.merges", [])
        tokenizer = _byte_level_bpe(tokens, types, merges, field_value(reader, "tokenizer.ggml.pre", "default"))

        def token(key: str) -> str | None:
            token_id = field_value(reader, key)
            return None if token_id is None else tokens[token_id]

        return cls(
            tokenizer,
            field_value(reader, "tokenizer.chat_template"),
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        )

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token text in it (e.g. "<|im_start|>") maps to its id.

        `add_special_tokens` adds what the tokenizer's post-processor adds (a BOS, for some);
        off by default because chat templates already write their own.
        """
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for a conversation, rendered with the model's Jinja chat template.

        Raises ValueError when the model has no template or the template rejects the messages.
        """
        if self.chat_template is None:
            raise ValueError("this model has no chat template")
        try:
            return _compile(self.chat_template).render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **kwargs,
            )
        except TemplateError as e:
            raise ValueError(f"chat template: {e}") from e


class IncrementalDetokenizer:
    """Token ids in one at a time, newly completed text out.

    Text is emitted only once it is stable: a token that ends inside a multi-byte UTF-8
    character decodes to U+FFFD until the next token completes it, so it waits. Decoding a
    short window (the last emitted token onwards) rather than the whole sequence keeps each
    step O(1) and lets byte-level merges across the boundary come out right.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # the window's start: tokens already emitted, kept for context
        self._read_offset = 0  # the first token whose text has not been emitted

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is unfinished)."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.token_ids[self._prefix_offset :])
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        return text[len(prefix) :]

    def flush(self) -> str:
        """What is still held back at the end of the sequence (replacement characters included)."""
        prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.token_ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self.token_ids)
        return text[len(prefix) :]

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)


def _byte_level_bpe(tokens: list[str], types: list[int], merges: list[str], pre: str) -> HFTokenizer:
    """GPT-2-style byte-level BPE from GGUF's token list (already byte-level strings) and merges."""
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
    tokenizer = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLITTING_PRE:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, <|endoftext|>...) must match whole, never be split by BPE.
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    added = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(added)
    return tokenizer


def field_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One GGUF metadata value as Python; `default` if absent."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _token_text(token: str | Mapping[str, Any] | None) -> str | None:
    # tokenizer_config.json writes a token as its text or as an AddedToken dict.
    if isinstance(token, Mapping):
        return str(token.get("content"))
    return token


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    # As transformers renders chat templates: sandboxed, trim_blocks and lstrip_blocks, and a
    # raise_exception() that templates call to reject a conversation. Compiled once per template
    # text (as transformers caches it too): compiling took 2.7 ms of every chat request for
    # SmolLM2's template and left the environment to the cyclic garbage collector; a compiled
    # template renders from any thread.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)
