"""URL → route: the path patterns Triton serves (SPEC §1.1)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    action: str
    model: str | None = None
    version: int | None = None
    region: str | None = None  # shared-memory routes: the region named in the path
    label: str | None = None  # /v2/models/{m}/labels/{label}/...: a version label (docs/version_labels.md)
    asset: str | None = None  # /console/{asset}: a static file of the web console


_MODEL = re.compile(
    r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+)|/labels/(?P<label>[^/]+))?"
    r"(?:/(?P<action>infer|generate|generate_stream|ready|config|stats))?$"
)
# Actions: shm_status, shm_register, shm_unregister (system) and cuda_status, ... (CUDA).
_SHARED_MEMORY = re.compile(
    r"^/v2/(?P<kind>system|cuda)sharedmemory(?:/region/(?P<region>[^/]+))?/(?P<action>status|register|unregister)$"
)
_MODEL_TRACE = re.compile(r"^/v2/models/(?P<model>[^/]+)/trace/setting$")
_MODEL_LABELS = re.compile(r"^/v2/models/(?P<model>[^/]+)/labels$")
_REPOSITORY = re.compile(r"^/v2/repository(?:/[^/]+)?/models/(?P<model>[^/]+)/(?P<action>load|unload)$")
# The web console (naiad.frontends.console): its page, static files and data endpoints.
_CONSOLE_ASSET = re.compile(r"^/console/(?P<asset>[A-Za-z0-9_-]+\.[a-z]+)$")
_CONSOLE_MODEL = re.compile(
    r"^/console/api/models/(?P<model>[^/]+)(?:/versions/(?P<version>[0-9]+))?/(?P<action>config\.pbtxt|infer)$"
)
_CONSOLE_ACTIONS = {"config.pbtxt": "console_config", "infer": "console_infer"}
_FIXED = {
    "/v2": "server_metadata",
    "/v2/": "server_metadata",
    "/v2/health/live": "live",
    "/v2/health/ready": "ready_server",
    "/v2/models/stats": "stats_all",
    "/v2/repository/index": "index",
    "/v2/logging": "logging",
    "/v2/trace/setting": "trace",
    "/openapi.json": "openapi",  # this API as an OpenAPI 3 document (openapi.json beside this module)
    # The OpenAI-compatible API (openai.py) shares the port.
    "/v1/models": "openai_models",
    "/v1/completions": "openai_completions",
    "/v1/chat/completions": "openai_chat_completions",
    "/v1/embeddings": "openai_embeddings",
    "/v1/rerank": "openai_rerank",
    "/v2/rerank": "openai_rerank",  # Cohere's v2 client's path (vLLM serves it too)
    "/rerank": "openai_rerank",  # Jina's and vLLM's, outside /v1
    "/v1/score": "openai_score",
    "/tokenize": "openai_tokenize",  # vLLM's paths, outside /v1
    "/detokenize": "openai_detokenize",
    "/": "console_page",
    "/console/api/live": "console_live",
}


#: Paths up to this long are remembered with their route (the few a server sees again and
#: again: each model's infer path); longer ones, which clients rarely repeat, are matched each time.
_CACHED_PATH = 256


def match(path: str) -> Route | None:
    """The route for `path`, or None (404)."""
    return _match_cached(path) if len(path) <= _CACHED_PATH else _match(path)


# Bounded: paths come from clients, and a scan of made-up paths only evicts older entries.
@functools.lru_cache(maxsize=1024)
def _match_cached(path: str) -> Route | None:
    return _match(path)


def _match(path: str) -> Route | None:
    action = _FIXED.get(path)
    if action is not None:
        return Route(action)
    found = _MODEL_TRACE.match(path)
    if found is not None:
        return Route("trace", found["model"])
    found = _MODEL_LABELS.match(path)
    if found is not None:
        return Route("model_labels", found["model"])
    found = _MODEL.match(path)
    if found is not None and not (found["label"] and (found["action"] or "").startswith("generate")):
        version = found["version"]
        return Route(
            "model_" + (found["action"] or "metadata"),
            found["model"],
            int(version) if version is not None else None,
            label=found["label"],
        )
    found = _REPOSITORY.match(path)
    if found is not None:
        return Route(found["action"], found["model"])
    found = _SHARED_MEMORY.match(path)
    if found is not None:
        prefix = "shm_" if found["kind"] == "system" else "cuda_"
        return Route(prefix + found["action"], region=found["region"])
    if path.startswith("/v2/repository/") and path.endswith("/index"):
        return Route("index")
    if path.startswith("/console/"):
        return _console(path)
    return None


def _console(path: str) -> Route | None:
    found = _CONSOLE_ASSET.match(path)
    if found is not None:
        return Route("console_asset", asset=found["asset"])
    found = _CONSOLE_MODEL.match(path)
    if found is not None:
        version = found["version"]
        return Route(_CONSOLE_ACTIONS[found["action"]], found["model"], int(version) if version is not None else None)
    return None
