"""naiad's command line: `naiad serve` (Triton's flags) and `naiad config MODEL_DIR`.

This is the composition root: flags become ServerOptions, and ServerOptions wire the server.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from naiad.config.options import AccessOptions, GrpcOptions, ServerOptions
from naiad.errors import NaiadError
from naiad.observability.statistics import LatencySettings
from naiad.observability.tracing import Tracer, settings_from_flags

log = logging.getLogger("naiad.cli")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got '{text}'")


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(text: str) -> int:
    """BYTES, or with a binary unit: 512M, 8G, 8Gi (k/m/g/t, optional i and B)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (value[:-1], value[-1]) if value and value[-1] in _BYTE_UNITS else (value, "")
    try:
        size = int(float(number) * _BYTE_UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: '{text}' (e.g. 536870912, 512M, 8G)") from None
    if size < 0:
        raise argparse.ArgumentTypeError(f"a size in bytes cannot be negative: '{text}'")
    return size


def _add_bool(parser: argparse.ArgumentParser, flag: str, default: bool, help: str) -> None:
    parser.add_argument(flag, type=_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help)


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    # `naiad tritonserver ...` too: an image whose entry point is `naiad` then runs the args of a
    # Triton ServingRuntime (`tritonserver --model-store=...`) unchanged.
    p = sub.add_parser("serve", aliases=["tritonserver"], help="serve a model repository (tritonserver's flags)")
    _serve_flags(p)


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-repository", "--model-store", dest="model_repository", action="append",
                   required=True,
                   help="model repository: a path, s3://[http(s)://host:port/]bucket/path, gs://bucket/path "
                        "or as://account/container/path (repeatable)")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    p.add_argument("--load-model", action="append", default=[], help="explicit mode: model to load at start")
    p.add_argument("--repository-poll-secs", type=float, default=None)
    p.add_argument("--model-config-name", default=None, help="use <model>/configs/<name>.pbtxt when present")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    _add_bool(p, "--strict-model-config", False, "deprecated: true disables auto-complete")
    _add_bool(p, "--strict-readiness", True, "ready only when every model is ready")
    _add_bool(p, "--exit-on-error", True, "exit when a model fails to load at start")
    p.add_argument("--exit-timeout-secs", type=float, default=30.0)
    p.add_argument("--model-load-thread-count", type=int, default=4)
    _add_bool(p, "--model-load-on-demand", False,
              "naiad: a request for a repository model that is not loaded loads it and waits (docs/residency.md)")
    p.add_argument("--model-memory-budget", type=_byte_size, default=0, metavar="BYTES",
                   help="naiad: host memory resident models may take (e.g. 8G); least recently used idle "
                        "models are unloaded to make room. Implies --model-load-on-demand (0: no budget)")
    p.add_argument("--backend-config", action="append", default=[], help="<backend>,<key>=<value>")
    _add_bool(p, "--allow-http", True, "serve HTTP")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024)
    p.add_argument("--http-read-timeout-secs", type=float, default=60.0,
                   help="naiad: seconds a client has to send a whole request (headers and body) once it "
                        "starts one, or to start one on a new connection; then 408 and close (0: no limit)")
    p.add_argument("--http-header-forward-pattern", default="",
                   help="regex: matching HTTP headers become request parameters")
    p.add_argument("--http-max-requests-per-connection", type=_non_negative, default=0, metavar="N",
                   help="naiad: after N responses on one keep-alive connection, answer with "
                        "'Connection: close' and close it, so clients reconnect and a load balancer "
                        "can spread them over replicas (0: no limit)")
    _add_bool(p, "--console", True, "naiad: serve the web console at / on the HTTP port (models, live "
              "charts, a form to try a model, an LLM chat); false: / answers 404")
    p.add_argument("--http-idle-timeout-secs", type=float, default=75.0,
                   help="naiad: close a keep-alive connection with no request for this long "
                        "(nginx's keepalive_timeout; 0: no limit)")
    p.add_argument("--max-connections", type=_non_negative, default=4096, metavar="N",
                   help="naiad: HTTP and gRPC connections open at once (nginx's worker_connections); at "
                        "the limit the longest-idle one is closed to make room, else the newcomer is "
                        "refused (HTTP 503, gRPC GOAWAY). Capped by the open-file limit (0: no limit)")
    _add_bool(p, "--allow-grpc", True, "serve gRPC")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001)
    _grpc_flags(p)
    _access_flags(p)
    _add_bool(p, "--allow-client-shm", False, "let clients register system shared memory regions")
    _add_bool(p, "--allow-metrics", True, "serve Prometheus metrics at /metrics on --metrics-port")
    _add_bool(p, "--allow-cpu-metrics", True, "include nv_cpu_utilization and the host's memory")
    _add_bool(p, "--allow-gpu-metrics", True, "accepted for compatibility (no GPU metrics yet)")
    p.add_argument("--metrics-address", default=None)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--metrics-config", action="append", default=[], metavar="KEY=VALUE",
                   help="counter_latencies, summary_latencies, histogram_latencies (true/false), "
                        "summary_quantiles=0.5:0.05,0.9:0.01,...")
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                   help="level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, triton,file=PATH, triton,log-frequency=N, "
                        "mode=opentelemetry, opentelemetry,url=URL, opentelemetry,resource=K=V, opentelemetry,bsp_*=N")
    p.add_argument("--trace-file", default=None, help="deprecated: --trace-config triton,file=PATH")
    p.add_argument("--trace-level", action="append", default=None, help="deprecated: --trace-config level=...")
    p.add_argument("--trace-rate", default=None, help="deprecated: --trace-config rate=N")
    p.add_argument("--trace-count", default=None, help="deprecated: --trace-config count=N")
    p.add_argument("--trace-log-frequency", default=None, help="deprecated: --trace-config triton,log-frequency=N")
    p.add_argument("--metrics-interval-ms", type=int, default=2000,
                   help="accepted for compatibility: metrics are read at scrape time")
    p.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                   help="response cache: local,size=BYTES (models opt in with response_cache { enable: true })")
    p.add_argument("--cache-directory", default=None,
                   help="accepted for tritonserver compatibility: the local cache is built in")
    p.add_argument("--response-cache-byte-size", type=int, default=None,
                   help="deprecated: --cache-config local,size=BYTES")
    p.add_argument("--rate-limit", choices=["off", "execution_count"], default="off")
    p.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]")
    p.add_argument("--id", default="triton", help="server id reported in server metadata")
    p.add_argument("--log-verbose", type=int, default=0)
    _add_bool(p, "--log-info", True, "log info messages")
    _add_bool(p, "--log-warning", True, "log warnings")
    _add_bool(p, "--log-error", True, "log errors")
    p.add_argument("--log-format", choices=["default", "ISO8601"], default="default")
    p.add_argument("--log-file", default="")


def _grpc_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpc-keepalive-time", type=int, default=7_200_000, help="ms")
    p.add_argument("--grpc-keepalive-timeout", type=int, default=20_000, help="ms")
    _add_bool(p, "--grpc-keepalive-permit-without-calls", False, "allow keepalive pings with no call open")
    p.add_argument("--grpc-http2-max-pings-without-data", type=int, default=2)
    p.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=int, default=300_000, help="ms")
    p.add_argument("--grpc-http2-max-ping-strikes", type=int, default=2)
    p.add_argument("--grpc-max-message-size", type=int, default=2**31 - 1, help="bytes, each direction")
    _add_bool(p, "--grpc-use-ssl", False, "serve gRPC over TLS")
    _add_bool(p, "--grpc-use-ssl-mutual", False, "require client certificates (implies --grpc-use-ssl)")
    p.add_argument("--grpc-server-cert", default="")
    p.add_argument("--grpc-server-key", default="")
    p.add_argument("--grpc-root-cert", default="")
    p.add_argument("--grpc-infer-response-compression-level", choices=["none", "low", "medium", "high"],
                   default="none")
    p.add_argument("--grpc-header-forward-pattern", default="",
                   help="regex: matching gRPC metadata keys become request parameters")
    p.add_argument("--grpc-infer-thread-count", type=int, default=2,
                   help="accepted for tritonserver compatibility; naiad's gRPC frontend uses no thread pool")
    p.add_argument("--grpc-transport", choices=["naiad", "grpcio"], default="naiad",
                   help="naiad: own asyncio HTTP/2 (fast); grpcio: grpc.aio's server")
    p.add_argument("--grpc-max-connection-age-ms", type=_non_negative, default=0, metavar="MS",
                   help="naiad: send GOAWAY to a connection this old (+-10%% jitter, as gRPC core's "
                        "GRPC_ARG_MAX_CONNECTION_AGE_MS), so long-lived channels reconnect and spread "
                        "over replicas (0: no limit)")
    p.add_argument("--grpc-max-connection-age-grace-ms", type=_non_negative, default=0, metavar="MS",
                   help="naiad: after that GOAWAY, calls still open get this long before the "
                        "connection is closed (GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS; 0: no limit)")
    p.add_argument("--grpc-handshake-timeout-secs", type=float, default=120.0,
                   help="naiad: seconds a new connection has to send the HTTP/2 preface and its first "
                        "frame (gRPC core's server handshake timeout), and any frame to complete once "
                        "begun; then it is closed (0: no limit)")
    _grpc_limit_flags(p)


def _grpc_limit_flags(p: argparse.ArgumentParser) -> None:
    """naiad's own transport against hostile clients (docs/reliability.md, "Hostile clients")."""
    p.add_argument("--grpc-max-concurrent-streams", type=_non_negative, default=128, metavar="N",
                   help="naiad: SETTINGS_MAX_CONCURRENT_STREAMS; streams past it are refused (0: no limit)")
    p.add_argument("--grpc-max-connection-idle-ms", type=_non_negative, default=300_000, metavar="MS",
                   help="naiad: GOAWAY and close a connection without calls for this long "
                        "(gRPC core's GRPC_ARG_MAX_CONNECTION_IDLE_MS; 0: no limit)")
    p.add_argument("--grpc-send-timeout-secs", type=float, default=60.0,
                   help="naiad: reset a call whose response makes no progress for this long (the client "
                        "reads nothing or opens no window; nginx's send_timeout; 0: no limit)")
    p.add_argument("--grpc-max-unsent-bytes", type=_non_negative, default=64 << 20, metavar="BYTES",
                   help="naiad: response bytes one connection may hold unsent; a response arriving past "
                        "it fails with RESOURCE_EXHAUSTED (0: no limit)")
    p.add_argument("--grpc-max-resets-per-sec", type=_non_negative, default=100, metavar="N",
                   help="naiad: streams a connection may reset or have refused per second, in bursts of "
                        "10 s worth; past it GOAWAY ENHANCE_YOUR_CALM (CVE-2023-44487; 0: no limit)")
    p.add_argument("--grpc-max-settings-per-sec", type=_non_negative, default=10, metavar="N",
                   help="naiad: SETTINGS frames a connection may send per second, bursts of 10 s worth")
    p.add_argument("--grpc-max-control-frames-per-sec", type=_non_negative, default=100, metavar="N",
                   help="naiad: frames that ask for nothing (PRIORITY, idle WINDOW_UPDATEs, empty DATA or "
                        "CONTINUATION...) a connection may send per second, bursts of 10 s worth")


def _grpc_options(args: argparse.Namespace) -> GrpcOptions:
    return GrpcOptions(
        keepalive_time_ms=args.grpc_keepalive_time,
        keepalive_timeout_ms=args.grpc_keepalive_timeout,
        keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=args.grpc_http2_min_recv_ping_interval_without_data,
        http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        max_message_size=args.grpc_max_message_size,
        use_ssl=args.grpc_use_ssl or args.grpc_use_ssl_mutual,
        use_ssl_mutual=args.grpc_use_ssl_mutual,
        server_cert=args.grpc_server_cert,
        server_key=args.grpc_server_key,
        root_cert=args.grpc_root_cert,
        response_compression_level=args.grpc_infer_response_compression_level,
        header_forward_pattern=args.grpc_header_forward_pattern,
        infer_thread_count=args.grpc_infer_thread_count,
        transport=args.grpc_transport,
        handshake_timeout_secs=args.grpc_handshake_timeout_secs,
        max_connection_age_ms=args.grpc_max_connection_age_ms,
        max_connection_age_grace_ms=args.grpc_max_connection_age_grace_ms,
        max_concurrent_streams=args.grpc_max_concurrent_streams,
        max_connection_idle_ms=args.grpc_max_connection_idle_ms,
        send_timeout_secs=args.grpc_send_timeout_secs,
        max_unsent_bytes=args.grpc_max_unsent_bytes,
        max_resets_per_sec=args.grpc_max_resets_per_sec,
        max_settings_per_sec=args.grpc_max_settings_per_sec,
        max_control_frames_per_sec=args.grpc_max_control_frames_per_sec,
    )


def _access_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="<API>,...:<KEY>=<VALUE>",
                   help="API groups (health, metadata, inference, shared-memory, model-config, model-repository, "
                        "statistics, trace, logging) that need the HTTP header KEY: VALUE (repeatable)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[], metavar="<API>,...:<KEY>=<VALUE>",
                   help="API groups that need the gRPC metadata triton-grpc-protocol-KEY: VALUE (repeatable)")
    p.add_argument("--auth-token", default=None,
                   help="naiad: require 'Authorization: Bearer TOKEN' (gRPC metadata 'authorization') on every "
                        "HTTP and gRPC endpoint but health; visible in ps: prefer --auth-token-file or "
                        "NAIAD_AUTH_TOKEN")
    p.add_argument("--auth-token-file", default=None, help="naiad: read the bearer token from this file")
    _add_bool(p, "--auth-health", False, "naiad: the bearer token guards the health endpoints too")
    p.add_argument("--http-ssl-cert", default="", help="naiad: serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--http-ssl-key", default="", help="naiad: the PEM private key of --http-ssl-cert")


def _access_options(args: argparse.Namespace, parser: argparse.ArgumentParser) -> AccessOptions:
    from naiad.frontends.access import GRPC_HEADER_PREFIX, parse_restricted, read_token

    try:
        http = parse_restricted(args.http_restricted_api, "http-restricted-api", "api")
        grpc = parse_restricted(args.grpc_restricted_protocol, "grpc-restricted-protocol", "protocol",
                                GRPC_HEADER_PREFIX)
        token = read_token(args.auth_token, args.auth_token_file, os.environ)
    except ValueError as error:
        parser.error(str(error))
    if bool(args.http_ssl_cert) != bool(args.http_ssl_key):
        parser.error("HTTPS needs both --http-ssl-cert and --http-ssl-key")
    return AccessOptions(http_restricted=http, grpc_restricted=grpc, auth_token=token,
                         auth_health=args.auth_health, http_ssl_cert=args.http_ssl_cert,
                         http_ssl_key=args.http_ssl_key)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="naiad", description="A Triton-compatible inference server.")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    config = sub.add_parser("config", help="print a model's auto-completed config as config.pbtxt")
    config.add_argument("model_dir", type=Path)
    config.add_argument("--model-config-name", default=None)
    from naiad.tools.bench.flags import add_parser as add_bench
    from naiad.tools.tune.flags import add_parser as add_tune

    add_bench(sub)
    add_tune(sub)
    node = sub.add_parser("llm-node", help="run this machine's ranks of a multi-node LLM (docs/llm.md)")
    node.add_argument("--master-addr", required=True, help="where rank 0 (the naiad serving the model) listens")
    node.add_argument("--master-port", type=int, default=29500, help="the model's master_port parameter")
    node.add_argument("--nnodes", type=int, required=True, help="machines in all, this one included")
    node.add_argument("--node-rank", type=int, default=0,
                      help="1 .. nnodes-1 (node 0 serves the model); 0 (default): the next free one")
    node.add_argument("--once", action="store_true", help="exit after one engine instead of waiting for the next")
    return parser


def options_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerOptions:
    """Check flag combinations as tritonserver does and build ServerOptions."""
    mode = args.model_control_mode
    if args.load_model and mode != "explicit":
        parser.error("--load-model requires --model-control-mode=explicit")
    if args.repository_poll_secs is not None and mode != "poll":
        parser.error("--repository-poll-secs is only valid with --model-control-mode=poll")
    metrics_config = dict(item.partition("=")[::2] for item in args.metrics_config)
    try:
        LatencySettings.from_config(metrics_config)
        trace_settings, opentelemetry = settings_from_flags(
            args.trace_config, args.trace_file, args.trace_level, args.trace_rate, args.trace_count,
            args.trace_log_frequency)
        Tracer(trace_settings)  # checks the values
    except (ValueError, NaiadError) as error:
        parser.error(str(error))
    backend_config = _backend_config(args.backend_config, parser)
    default_mbs = backend_config.get("", {}).get("default-max-batch-size", "4")
    return ServerOptions(
        model_repositories=_repositories(args.model_repository, parser),
        model_control_mode=mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs if args.repository_poll_secs is not None else 15.0,
        model_config_name=args.model_config_name,
        auto_complete_config=not (args.disable_auto_complete_config or args.strict_model_config),
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        model_load_thread_count=args.model_load_thread_count,
        model_load_on_demand=args.model_load_on_demand or args.model_memory_budget > 0,
        model_memory_budget=args.model_memory_budget,
        default_max_batch_size=int(default_mbs),
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        http_read_timeout_secs=args.http_read_timeout_secs,
        http_header_forward_pattern=args.http_header_forward_pattern,
        http_max_requests_per_connection=args.http_max_requests_per_connection,
        console=args.console,
        http_idle_timeout_secs=args.http_idle_timeout_secs,
        max_connections=args.max_connections,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc=_grpc_options(args),
        allow_client_shm=args.allow_client_shm,
        allow_metrics=args.allow_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        metrics_config=metrics_config,
        trace_settings=trace_settings,
        trace_opentelemetry=opentelemetry,
        rate_limit=args.rate_limit,
        rate_limit_resources=_rate_limit_resources(args.rate_limit_resource, parser),
        server_id=args.id,
        backend_config=backend_config,
        response_cache_bytes=_response_cache_bytes(args.cache_config, args.response_cache_byte_size, parser),
        access=_access_options(args, parser),
    )


def _repositories(values: list[str], parser: argparse.ArgumentParser) -> tuple[Path | str, ...]:
    """Local paths become Paths; s3:// gs:// as:// URLs stay strings (a Path would fold their '//')."""
    from naiad.repository.location import LocationError, parse_repository

    repositories: list[Path | str] = []
    for value in values:
        try:
            parsed = parse_repository(value)
        except LocationError as error:
            parser.error(str(error))
        repositories.append(parsed if isinstance(parsed, Path) else value)
    return tuple(repositories)


def _rate_limit_resources(values: list[str], parser: argparse.ArgumentParser) -> dict[tuple[str, int | None], int]:
    """`name:count` (every device) or `name:count:device`."""
    resources: dict[tuple[str, int | None], int] = {}
    for value in values:
        parts = value.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
            parser.error(f"--rate-limit-resource expects <name>:<count>[:<device>], got '{value}'")
        device = int(parts[2]) if len(parts) == 3 else None
        resources[(parts[0], device)] = int(parts[1])
    return resources


def _response_cache_bytes(values: list[str], byte_size: int | None, parser: argparse.ArgumentParser) -> int:
    """The local cache's size from `--cache-config local,size=N` (or the deprecated
    `--response-cache-byte-size N`, where 0 means no cache); 0 when neither is given."""
    if byte_size is not None and values:
        parser.error("Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                     "Please provide one or the other.")
    if byte_size is not None:
        if byte_size < 0:
            parser.error(f"--response-cache-byte-size must not be negative, got {byte_size}")
        return byte_size
    size = 0
    for value in values:
        cache, comma, setting = value.partition(",")
        key, equals, item = setting.partition("=")
        if not comma or not equals:
            parser.error(f"--cache-config expects <cache>,<key>=<value>, got '{value}'")
        if cache != "local":
            parser.error(f"--cache-config: only the 'local' cache is available, got '{cache}'")
        if key != "size":
            parser.error(f"--cache-config: unknown setting '{key}' for the local cache (it takes size=<bytes>)")
        if not item.isdigit() or int(item) == 0:
            parser.error(f"--cache-config local,size must be a positive number of bytes, got '{item}'")
        size = int(item)
    return size


def _backend_config(values: list[str], parser: argparse.ArgumentParser) -> dict[str, dict[str, str]]:
    """`<backend>,<key>=<value>`, or `<key>=<value>` for a global setting (backend "")."""
    result: dict[str, dict[str, str]] = {}
    for value in values:
        backend, _, setting = value.rpartition(",")
        key, sep, item = setting.partition("=")
        if not sep or not key:
            parser.error(f"--backend-config expects <backend>,<setting>=<value>, got '{value}'")
        result.setdefault(backend, {})[key] = item
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "config":
        return _print_config(args)
    if args.command == "llm-node":
        return _llm_node(args, parser)
    if args.command == "bench":
        from naiad.tools.bench.command import run as bench

        return bench(args, in_process=_in_process_target)
    if args.command == "tune":
        from naiad.tools.tune.command import run as tune

        return tune(args)
    return _serve(args, options_from_args(args, parser))


async def _in_process_target(args: argparse.Namespace) -> object:
    """`naiad bench --in-process`: a server in this process (the tools themselves never import the core)."""
    from naiad.tools.inprocess import start

    return await start(args)


def _llm_node(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import importlib
    from multiprocessing import AuthenticationError

    # By name, as the backend registry loads backends: the agent's ranks need torch, and
    # `naiad.cli` must not reach it by import (the import-linter contract).
    nodes = importlib.import_module("naiad.llm.distributed.nodes")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(nodes.serve_node(nodes.Cluster(args.nnodes, args.master_addr, args.master_port), args.node_rank,
                                    once=args.once))
    except ValueError as error:
        parser.error(str(error))
    except AuthenticationError:
        parser.exit(1, f"naiad llm-node: {args.master_addr}:{args.master_port} refused this node's "
                       "$NAIAD_CLUSTER_KEY\n")
    except RuntimeError as error:  # rank 0 has no place for this node
        parser.exit(1, f"naiad llm-node: {error}\n")
    except KeyboardInterrupt:
        return 130


def build_tritonserver_parser() -> argparse.ArgumentParser:
    """`tritonserver`'s own command line: the serve flags with no subcommand."""
    parser = argparse.ArgumentParser(prog="tritonserver",
                                     description="naiad under Triton's entry-point name (same flags as naiad serve).")
    _serve_flags(parser)
    return parser


def tritonserver_main(argv: Sequence[str] | None = None) -> int:
    """The `tritonserver` console script: a drop-in for Triton's binary, so a KServe
    ServingRuntime (or any manifest) written for Triton runs naiad with its args unchanged."""
    parser = build_tritonserver_parser()
    args = parser.parse_args(argv)
    return _serve(args, options_from_args(args, parser))


def _print_config(args: argparse.Namespace) -> int:
    from naiad.config.model_config import config_to_pbtxt
    from naiad.core.loader import prepare_config
    from naiad.errors import NaiadError

    model_dir: Path = args.model_dir.resolve()
    options = ServerOptions(model_repositories=(model_dir.parent,), model_config_name=args.model_config_name)
    try:
        config, _ = prepare_config(model_dir.name, model_dir, options)
    except NaiadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(config_to_pbtxt(config))
    return 0


def _serve(args: argparse.Namespace, options: ServerOptions) -> int:
    from naiad.frontends.serve import run
    from naiad.observability.logs import LogSettings

    log_settings = LogSettings(args.log_file, args.log_info, args.log_warning, args.log_error,
                               args.log_verbose, args.log_format)
    try:
        import uvloop
    except ImportError:
        code = asyncio.run(run(options, log_settings))
    else:
        code = uvloop.run(run(options, log_settings))
    # Skip interpreter teardown: after an exit timeout an instance thread may still be inside a
    # framework's C++ code, and finalizing under it aborts the process instead of exiting.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
