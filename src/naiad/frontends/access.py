"""Who may call which API, the same for HTTP and gRPC: Triton's restricted API groups
(--http-restricted-api / --grpc-restricted-protocol) and naiad's optional bearer token.

Each frontend maps its routes or RPCs to an API group and builds one `Gate` per route that
needs a check; a route without a gate costs one dict lookup and nothing else. A frontend that
is given no restriction and no token builds no gates at all.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

#: Triton's API groups (docs/customization_guide/inference_protocols.md, "Limit Endpoint Access").
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")

#: Not an API group: routes that need no token and no restricted header (the web console's
#: static files, which hold no data).
PUBLIC = "public"

#: What gRPC prefixes to a restricted key: the metadata checked is `triton-grpc-protocol-<key>`.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

#: A restriction: the header a request must carry and the value it must have.
Restriction = tuple[str, str]


def parse_restricted(values: Iterable[str], option: str, feature: str,
                     prefix: str = "") -> dict[str, Restriction]:
    """`<group>,<group>...:<key>=<value>` flags → {group: (prefix + key, value)}.

    `option` names the flag and `feature` the kind of group ("api" for HTTP, "protocol" for
    gRPC), as Triton's messages do. ValueError with Triton's text for a malformed value, an
    unknown group, or a group named in two flags.
    """
    restricted: dict[str, Restriction] = {}
    for value in values:
        groups, _, setting = value.partition(":")
        key, equals, expected = setting.partition("=")
        if not groups or not key or not equals or not expected:
            raise ValueError(f"--{option} option format is '<config name>:<setting>=<value>'. Got {value}")
        for group in groups.split(","):
            if group not in API_GROUPS:
                raise ValueError(f"unknown restricted {feature} '{group}'")
            if group in restricted:
                raise ValueError(f"restricted {feature} '{group}' can not be specified in multiple config groups")
            restricted[group] = (prefix + key, expected)
    return restricted


def read_token(token: str | None, token_file: str | None, environ: Mapping[str, str]) -> str:
    """The bearer token from --auth-token, --auth-token-file or NAIAD_AUTH_TOKEN (in that
    order); "" when none is set. ValueError when both flags are given, or the file cannot be
    read or holds nothing."""
    if token is not None and token_file is not None:
        raise ValueError("--auth-token and --auth-token-file are mutually exclusive")
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as file:
                token = file.read().strip()
        except OSError as error:
            raise ValueError(f"failed to read --auth-token-file '{token_file}': {error.strerror or error}") from None
        if not token:
            raise ValueError(f"--auth-token-file '{token_file}' is empty")
        return token
    if token is not None:
        if not token.strip():
            raise ValueError("--auth-token must not be empty")
        return token.strip()
    return environ.get("NAIAD_AUTH_TOKEN", "").strip()


class Denial(Enum):
    """Why a request was refused: each frontend maps it to its own status code."""

    UNAUTHENTICATED = "unauthenticated"  # no or a wrong bearer token: HTTP 401, gRPC UNAUTHENTICATED
    RESTRICTED = "restricted"  # the restricted group's header is missing or wrong: HTTP 403, gRPC UNAVAILABLE


MISSING_TOKEN = "missing bearer token: send the header 'Authorization: Bearer <token>'"
WRONG_TOKEN = "invalid bearer token"


@dataclass(frozen=True, slots=True)
class Gate:
    """What one route asks of a request: the bearer token, a restricted header, or both."""

    token: bytes | None  # the bearer token required, or None
    header: str | None  # the restricted header's name, lower case (HTTP headers and gRPC keys are)
    value: bytes  # the value the restricted header must have
    restricted_message: str  # Triton's text for a request without the header

    def check(self, authorization: str | bytes | None, restricted: str | bytes | None) -> tuple[Denial, str] | None:
        """None when the request may go on; else why not, with the message to send.

        `authorization` is the request's Authorization header and `restricted` the value of
        `self.header`, each None when absent. Secrets are compared in constant time."""
        if self.token is not None:
            if authorization is None:
                return Denial.UNAUTHENTICATED, MISSING_TOKEN
            scheme, _, credentials = _bytes(authorization).strip().partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.token):
                return Denial.UNAUTHENTICATED, WRONG_TOKEN
        if self.header is not None and (restricted is None
                                        or not hmac.compare_digest(_bytes(restricted), self.value)):
            return Denial.RESTRICTED, self.restricted_message
        return None


def gates(groups: Mapping[str, str | None], restricted: Mapping[str, Restriction], token: str,
          token_for_health: bool, restricted_message: str) -> dict[str, Gate]:
    """A gate for each route (key of `groups`, valued by its API group, PUBLIC or None) that needs one.

    `restricted_message` is a format with `{header}` (Triton's HTTP and gRPC texts differ).
    Health routes skip the token unless `token_for_health`: probes (Kubernetes, load
    balancers) rarely hold secrets, and liveness says nothing about the models."""
    secret = token.encode() if token else None
    table: dict[str, Gate] = {}
    for route, group in groups.items():
        if group == PUBLIC:
            continue
        needs_token = secret if group != "health" or token_for_health else None
        restriction = restricted.get(group) if group is not None else None
        if needs_token is None and restriction is None:
            continue
        header, value = restriction if restriction is not None else (None, "")
        message = restricted_message.format(header=header) if header is not None else ""
        table[route] = Gate(needs_token, header.lower() if header is not None else None, value.encode(), message)
    return table


def _bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("latin-1", "replace")
