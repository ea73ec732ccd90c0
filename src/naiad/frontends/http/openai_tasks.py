"""Which repository models serve which OpenAI task, from their configs: "llm" models generate,
and a model that turns text into a vector serves embeddings (`/v1/embeddings`, see
openai_embeddings), an "llm" model too when its config sets `pooling` (last or mean). Shared by
`/v1/models` and the task endpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from naiad.core.server import InferenceServer
from naiad.errors import InternalError, InvalidArgument, NaiadError, NotFound

TASK = "openai_task"  # config parameter: "embedding" declares the task
LLM_BACKEND = "llm"
#: an "llm" model's config parameter that makes it an embedder (pooling its final hidden states),
#: and the output its vectors come in (naiad.backends.llm)
LLM_POOLING, LLM_EMBEDDING = "pooling", "embedding"
TOKENS_OUTPUT = "openai_tokens_output"  # config parameter: the output holding each text's token count


@dataclass(frozen=True, slots=True)
class Embedder:
    """How one model serves embeddings: its text input, vector output and batch size."""

    name: str
    text_input: str
    vector_output: str
    size: int  # the vector's length
    max_batch: int  # 0: one text per request
    tokens_output: str | None
    #: request parameters every request carries; an "llm" model embeds with its `pooling`
    parameters: tuple[tuple[str, str], ...] = ()
    streamed: bool = False  # a decoupled model answers through server.stream


def embedder(name: str, config: mc.ModelConfig) -> Embedder | None:
    """The model as an embedder, or None when it is not one. It is one when its config says so
    (`openai_task: "embedding"`) or when its shape leaves no doubt: its one input BYTES of dims
    [1] and one FP32 output of one dimension (a vector per text). A declared embedder without
    that input and output is a configuration mistake, named in an InternalError."""
    task = config.parameters[TASK].string_value if TASK in config.parameters else ""
    if task and task != "embedding":
        return None
    if config.backend == LLM_BACKEND:  # a generating model: an embedder too when it pools
        if LLM_POOLING not in config.parameters:
            return None
        vectors = [t for t in config.output if t.name == LLM_EMBEDDING]
        if not vectors:
            raise InternalError(f"model '{name}' sets pooling but has no '{LLM_EMBEDDING}' output")
        return Embedder(name, "text_input", LLM_EMBEDDING, int(vectors[0].dims[0]), 0, "prompt_tokens",
                        ((LLM_POOLING, config.parameters[LLM_POOLING].string_value),), streamed=True)
    texts = [t for t in config.input if t.data_type == mc.TYPE_STRING and list(t.dims) == [1]]
    vectors = [t for t in config.output if t.data_type == mc.TYPE_FP32 and len(t.dims) == 1 and t.dims[0] > 0]
    if task != "embedding" and not (len(config.input) == 1 and len(texts) == 1 and len(vectors) == 1):
        return None
    if len(texts) != 1 or len(vectors) != 1:
        if task == "embedding":  # declared, but no shape naiad can drive: a config mistake to name
            raise InternalError(f"model '{name}' declares openai_task embedding but has no single BYTES input "
                                "of dims [1] and FP32 vector output")
        return None
    tokens = config.parameters[TOKENS_OUTPUT].string_value if TOKENS_OUTPUT in config.parameters else None
    return Embedder(name, texts[0].name, vectors[0].name, int(vectors[0].dims[0]), config.max_batch_size, tokens)


def embedding_models(server: InferenceServer) -> list[str]:
    """The ready models that serve embeddings, by name."""
    names = sorted({entry["name"] for entry in server.repository_index(ready_only=True)})
    return [name for name in names if embedder_or_none(server, name) is not None]


def embedder_or_none(server: InferenceServer, name: str) -> Embedder | None:
    try:
        return embedder(name, server.model_config_message(name, None))
    except NaiadError:
        return None


def require_embedder(server: InferenceServer, name: Any, refusal: str) -> Embedder:
    """The embedder a request's `model` names; a 400 for a name that is not a string, OpenAI's
    404 for an unknown model, and InvalidArgument(`refusal`) for a model that is no embedder."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("'model' must be a model name")
    try:
        config = server.model_config_message(name, None)
    except NotFound:
        raise NotFound(f"The model '{name}' does not exist") from None
    model = embedder(name, config)
    if model is None:
        raise InvalidArgument(refusal)
    return model


def check_fields(body: dict[str, Any], known: set[str] | frozenset[str]) -> None:
    """A request field this server does not know is a 400 that names it."""
    unknown = sorted(key for key in body if key not in known)
    if unknown:
        raise InvalidArgument(f"unknown field '{unknown[0]}': it is not supported by this server")
