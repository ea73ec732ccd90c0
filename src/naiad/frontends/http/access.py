"""Access control on the HTTP routes: each route's API group, and the refusal replies.

The checks themselves are protocol-neutral (`naiad.frontends.access`); this module only knows
which route belongs to which group and how HTTP says no: 403 with Triton's body for a
restricted group (http_server.cc RespondIfRestricted), 401 with `WWW-Authenticate: Bearer`
(RFC 6750) for a missing or wrong bearer token.
"""

from __future__ import annotations

import msgspec

from naiad.frontends.access import PUBLIC, Denial, Gate, Restriction, gates
from naiad.frontends.http.reply import Reply

#: The route for a path that matches none (`routes.match` gives None): it needs the token only.
NO_ROUTE = ""

#: Route action (routes.py) → Triton API group. The OpenAI routes follow Triton's OpenAI
#: frontend (completions are inference, /v1/models is the model repository).
ACTION_GROUPS: dict[str, str | None] = {
    "live": "health", "ready_server": "health", "model_ready": "health",
    "server_metadata": "metadata", "model_metadata": "metadata", "openapi": "metadata", "model_labels": "metadata",
    "model_infer": "inference", "model_generate": "inference", "model_generate_stream": "inference",
    "openai_completions": "inference", "openai_chat_completions": "inference", "openai_embeddings": "inference",
    "openai_rerank": "inference", "openai_score": "inference", "openai_tokenize": "inference",
    "openai_detokenize": "inference",
    "model_config": "model-config",
    "index": "model-repository", "load": "model-repository", "unload": "model-repository",
    "openai_models": "model-repository",
    "model_stats": "statistics", "stats_all": "statistics",
    "shm_status": "shared-memory", "shm_register": "shared-memory", "shm_unregister": "shared-memory",
    "cuda_status": "shared-memory", "cuda_register": "shared-memory", "cuda_unregister": "shared-memory",
    "trace": "trace",
    "logging": "logging",
    # The web console: its page and files are public (a browser cannot send a bearer token when
    # it opens a page; the page asks for one), its data follows the API it reveals.
    "console_page": PUBLIC, "console_asset": PUBLIC,
    "console_live": "statistics", "console_config": "model-config", "console_infer": "inference",
    NO_ROUTE: None,
}

_RESTRICTED = "This API is restricted, expecting header '{header}'"
_CHALLENGE = {
    "missing": [(b"www-authenticate", b'Bearer realm="naiad"')],
    "wrong": [(b"www-authenticate", b'Bearer realm="naiad", error="invalid_token"')],
}


def http_gates(restricted: dict[str, Restriction], token: str, token_for_health: bool) -> dict[str, Gate]:
    """The gate of each HTTP route that needs one (none at all when nothing is configured)."""
    return gates(ACTION_GROUPS, restricted, token, token_for_health, _RESTRICTED)


def check(gate: Gate, headers: dict[bytes, bytes]) -> Reply | None:
    """None when the request may go on, else the refusal to send."""
    restricted = headers.get(gate.header.encode()) if gate.header is not None else None
    denied = gate.check(headers.get(b"authorization"), restricted)
    if denied is None:
        return None
    reason, message = denied
    body = msgspec.json.encode({"error": message})
    if reason is Denial.RESTRICTED:
        return Reply(403, body)
    challenge = _CHALLENGE["missing" if b"authorization" not in headers else "wrong"]
    return Reply(401, body, headers=list(challenge))
