"""Access control without a server: parsing Triton's restricted-API flags (its exact messages),
the bearer token's sources, the gate checks, the HTTP refusals, and that every HTTP route and
gRPC method belongs to an API group (so a new one cannot slip past the checks unnoticed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import grpc
import msgspec
import pytest
from grpc_health.v1 import health_pb2
from tritonclient.grpc import service_pb2

from naiad.cli import build_parser, options_from_args
from naiad.core.server import InferenceServer
from naiad.frontends.access import (
    API_GROUPS,
    GRPC_HEADER_PREFIX,
    MISSING_TOKEN,
    PUBLIC,
    WRONG_TOKEN,
    Denial,
    gates,
    parse_restricted,
    read_token,
)
from naiad.frontends.console.endpoints import ConsoleEndpoints
from naiad.frontends.grpc.access import METHOD_GROUPS, grpc_gates, guard
from naiad.frontends.http import handlers
from naiad.frontends.http.access import ACTION_GROUPS, NO_ROUTE, check, http_gates

# ------------------------------------------------------------------------------- flag parsing


def test_parse_groups_key_and_value() -> None:
    parsed = parse_restricted(["health,inference:infer-key=infer-value", "model-repository:admin-key=a=b"],
                              "http-restricted-api", "api")
    assert parsed == {"health": ("infer-key", "infer-value"), "inference": ("infer-key", "infer-value"),
                      "model-repository": ("admin-key", "a=b")}


def test_parse_grpc_prefix() -> None:
    parsed = parse_restricted(["inference:k=v"], "grpc-restricted-protocol", "protocol", GRPC_HEADER_PREFIX)
    assert parsed == {"inference": ("triton-grpc-protocol-k", "v")}


@pytest.mark.parametrize("value", ["inference", "inference:k", "inference:=v", ":k=v", "inference:k=", "k=v"])
def test_parse_malformed(value: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_restricted([value], "http-restricted-api", "api")
    assert str(caught.value) == (f"--http-restricted-api option format is '<config name>:<setting>=<value>'. "
                                 f"Got {value}")


def test_parse_unknown_group() -> None:
    with pytest.raises(ValueError, match=r"^unknown restricted protocol 'model-reposit'$"):
        parse_restricted(["model-reposit,health:k1=v1"], "grpc-restricted-protocol", "protocol")


@pytest.mark.parametrize("values", [["model-repository,health:k1=v1", "metadata,health:k2=v2"],
                                    ["health,health:k=v"]])
def test_parse_group_twice(values: list[str]) -> None:
    with pytest.raises(ValueError, match=r"^restricted api 'health' can not be specified in multiple config groups$"):
        parse_restricted(values, "http-restricted-api", "api")


def test_every_triton_group_is_known() -> None:
    parsed = parse_restricted([",".join(API_GROUPS) + ":k=v"], "http-restricted-api", "api")
    assert sorted(parsed) == sorted(API_GROUPS)


# -------------------------------------------------------------------------------- the token


def test_token_sources(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text("from-file\n")
    assert read_token(None, None, {}) == ""
    assert read_token(None, None, {"NAIAD_AUTH_TOKEN": "from-env"}) == "from-env"
    assert read_token("from-flag", None, {"NAIAD_AUTH_TOKEN": "from-env"}) == "from-flag"
    assert read_token(None, str(file), {"NAIAD_AUTH_TOKEN": "from-env"}) == "from-file"


def test_token_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="mutually exclusive"):
        read_token("a", str(empty), {})
    with pytest.raises(ValueError, match=r"--auth-token-file '.*empty' is empty"):
        read_token(None, str(empty), {})
    with pytest.raises(ValueError, match=r"failed to read --auth-token-file '.*missing': No such file"):
        read_token(None, str(tmp_path / "missing"), {})
    with pytest.raises(ValueError, match="--auth-token must not be empty"):
        read_token(" ", None, {})


# -------------------------------------------------------------------------------- the gates


def test_nothing_configured_builds_no_gates() -> None:
    assert http_gates({}, "", False) == {}
    assert grpc_gates({}, "", False) == {}


def test_token_gate() -> None:
    gate = gates({"infer": "inference"}, {}, "s3cret", False, "{header}")["infer"]
    assert gate.check(None, None) == (Denial.UNAUTHENTICATED, MISSING_TOKEN)
    assert gate.check("Bearer wrong", None) == (Denial.UNAUTHENTICATED, WRONG_TOKEN)
    assert gate.check("Basic s3cret", None) == (Denial.UNAUTHENTICATED, WRONG_TOKEN)
    assert gate.check("Bearer", None) == (Denial.UNAUTHENTICATED, WRONG_TOKEN)
    assert gate.check("Bearer s3cret", None) is None
    assert gate.check(b"bearer  s3cret ", None) is None  # the scheme is case-insensitive (RFC 7235)


def test_restricted_gate_and_health() -> None:
    table = gates({"live": "health", "infer": "inference", "config": "model-config"},
                  {"inference": ("Infer-Key", "v")}, "", False, "expecting header '{header}'")
    assert set(table) == {"infer"}  # the others need nothing: no gate, no cost
    gate = table["infer"]
    assert gate.header == "infer-key"  # looked up in lower case, named as given
    assert gate.check(None, None) == (Denial.RESTRICTED, "expecting header 'Infer-Key'")
    assert gate.check(None, "x") == (Denial.RESTRICTED, "expecting header 'Infer-Key'")
    assert gate.check(None, "v") is None


def test_health_open_to_probes_unless_asked() -> None:
    groups = {"live": "health", "infer": "inference"}
    assert set(gates(groups, {}, "t", False, "")) == {"infer"}
    assert set(gates(groups, {}, "t", True, "")) == {"live", "infer"}
    # A restricted health group is still restricted without the token.
    assert set(gates(groups, {"health": ("k", "v")}, "t", False, "")) == {"live", "infer"}
    assert gates(groups, {"health": ("k", "v")}, "t", False, "")["live"].token is None


def test_token_checked_before_restriction() -> None:
    gate = gates({"infer": "inference"}, {"inference": ("k", "v")}, "t", False, "{header}")["infer"]
    assert gate.check(None, "v")[0] is Denial.UNAUTHENTICATED  # type: ignore[index]
    assert gate.check("Bearer t", None)[0] is Denial.RESTRICTED  # type: ignore[index]
    assert gate.check("Bearer t", "v") is None


# -------------------------------------------------------------------------------- HTTP and gRPC


def test_http_refusals() -> None:
    table = http_gates({"inference": ("infer-key", "v")}, "t", False)
    assert "live" not in table and "ready_server" not in table and "model_ready" not in table
    restricted = check(table["model_infer"], {b"authorization": b"Bearer t"})
    assert restricted is not None and restricted.status == 403
    assert msgspec.json.decode(restricted.body) == {"error": "This API is restricted, expecting header 'infer-key'"}
    missing = check(table[NO_ROUTE], {})
    assert missing is not None and missing.status == 401
    assert missing.headers == [(b"www-authenticate", b'Bearer realm="naiad"')]
    assert msgspec.json.decode(missing.body) == {"error": MISSING_TOKEN}
    wrong = check(table["model_config"], {b"authorization": b"Bearer x"})
    assert wrong is not None and wrong.status == 401
    assert wrong.headers == [(b"www-authenticate", b'Bearer realm="naiad", error="invalid_token"')]
    assert check(table["model_infer"], {b"authorization": b"Bearer t", b"infer-key": b"v"}) is None


def test_every_http_route_has_a_group() -> None:
    actions = {action for action, _ in handlers.HANDLERS}
    console = {action for action, _ in ConsoleEndpoints(cast(InferenceServer, None)).handlers()}
    assert actions | console <= set(ACTION_GROUPS)
    assert set(ACTION_GROUPS.values()) - {None, PUBLIC} == set(API_GROUPS)


def test_public_routes_need_nothing() -> None:
    """The console's page and files answer without the token or a restricted header (a browser
    opening a page sends neither); its data endpoints follow their API group's rules."""
    table = http_gates({group: ("key", "v") for group in API_GROUPS}, "t", True)
    assert "console_page" not in table and "console_asset" not in table
    assert check(table["console_live"], {}) is not None
    assert check(table["console_live"], {b"authorization": b"Bearer t", b"key": b"v"}) is None
    assert table["console_live"].header == table["stats_all"].header
    assert table["console_config"].header == table["model_config"].header
    assert table["console_infer"].header == table["model_infer"].header


def test_every_grpc_method_has_a_group() -> None:
    services = (service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                health_pb2.DESCRIPTOR.services_by_name["Health"])
    names = {method.name for service in services for method in service.methods}
    assert names == set(METHOD_GROUPS)
    assert set(METHOD_GROUPS.values()) == set(API_GROUPS)


class _Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(code, details)


class _Servicer:
    async def ModelInfer(self, request: str, context: _Context) -> str:
        return "answered " + request

    async def ServerLive(self, request: str, context: _Context) -> str:
        return "live"


def test_grpc_guard() -> None:
    servicer = _Servicer()
    guard([servicer], grpc_gates({"inference": ("triton-grpc-protocol-k", "v")}, "t", False))
    assert asyncio.run(servicer.ServerLive("x", _Context([]))) == "live"  # health: open
    with pytest.raises(RuntimeError) as caught:
        asyncio.run(servicer.ModelInfer("x", _Context([])))
    assert caught.value.args == (grpc.StatusCode.UNAUTHENTICATED, MISSING_TOKEN)
    with pytest.raises(RuntimeError) as caught:
        asyncio.run(servicer.ModelInfer("x", _Context([("authorization", "Bearer t")])))
    assert caught.value.args == (grpc.StatusCode.UNAVAILABLE,
                                 "This protocol is restricted, expecting header 'triton-grpc-protocol-k'")
    context = _Context([("authorization", "Bearer t"), ("triton-grpc-protocol-k", "v")])
    assert asyncio.run(servicer.ModelInfer("x", context)) == "answered x"


# -------------------------------------------------------------------------------- the flags


def _options(*argv: str):  # type: ignore[no-untyped-def]
    parser = build_parser()
    return options_from_args(parser.parse_args(["serve", "--model-repository", "/models", *argv]), parser)


def test_flags_to_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NAIAD_AUTH_TOKEN", raising=False)
    access = _options("--http-restricted-api=inference:k=v", "--grpc-restricted-protocol=health,trace:g=w",
                      "--auth-token=t", "--auth-health", "--http-ssl-cert=c.pem", "--http-ssl-key=k.pem").access
    assert access.http_restricted == {"inference": ("k", "v")}
    assert access.grpc_restricted == {"health": ("triton-grpc-protocol-g", "w"),
                                      "trace": ("triton-grpc-protocol-g", "w")}
    assert (access.auth_token, access.auth_health) == ("t", True)
    assert (access.http_ssl_cert, access.http_ssl_key) == ("c.pem", "k.pem")
    assert _options().access.auth_token == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["--http-restricted-api=inference"], "--http-restricted-api option format is"),
    (["--grpc-restricted-protocol=inference,bogus:k=v"], "unknown restricted protocol 'bogus'"),
    (["--grpc-restricted-protocol=inference:k=v", "--grpc-restricted-protocol=inference:k=w"],
     "restricted protocol 'inference' can not be specified in multiple config groups"),
    (["--http-ssl-cert=c.pem"], "HTTPS needs both --http-ssl-cert and --http-ssl-key"),
    (["--auth-token=a", "--auth-token-file=/nonexistent"], "mutually exclusive"),
])
def test_bad_flags_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        _options(*argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
