"""ServerOptions: everything the command line decides, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    """The gRPC frontend's flags (tritonserver's names, defaults and units)."""

    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    max_message_size: int = 2**31 - 1
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""
    response_compression_level: str = "none"  # none | low | medium | high
    header_forward_pattern: str = ""
    infer_thread_count: int = 2  # accepted for tritonserver compatibility; no thread pool is used
    transport: str = "naiad"  # naiad (own asyncio HTTP/2) | grpcio (grpc.aio server)
    # naiad's own: a connection must send the HTTP/2 preface and its first frame within this
    # (gRPC core's server handshake timeout, 120 s), and finish any frame it begins; 0 = no limit
    handshake_timeout_secs: float = 120.0
    # naiad's own, gRPC core's GRPC_ARG_MAX_CONNECTION_AGE_MS / _GRACE_MS: a connection this old
    # (+-10 % jitter) gets GOAWAY so clients reconnect and spread over replicas behind a load
    # balancer; its open calls then get the grace before it is closed. 0 = no limit (each)
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0
    # Hostile clients (docs/reliability.md, "Hostile clients"); naiad's own transport unless said.
    # SETTINGS_MAX_CONCURRENT_STREAMS: streams past it are refused (nginx 128; grpcio gets it too)
    max_concurrent_streams: int = 128
    # gRPC core's GRPC_ARG_MAX_CONNECTION_IDLE_MS: a connection without calls this long gets
    # GOAWAY and is closed (grpcio gets it too); 0 = no limit
    max_connection_idle_ms: int = 300_000
    # a call whose response makes no progress for this long (the client reads nothing, or opens
    # no window) is reset (nginx's send_timeout); 0 = no limit
    send_timeout_secs: float = 60.0
    # response bytes one connection may hold unsent (flow control or a full socket): a response
    # arriving past it fails with RESOURCE_EXHAUSTED instead of being kept
    max_unsent_bytes: int = 64 << 20
    # floods: frames of each kind a connection may send per second, with bursts of ten seconds'
    # worth; past it, GOAWAY ENHANCE_YOUR_CALM. Resets count the client's RST_STREAMs of live
    # streams and the streams refused (CVE-2023-44487); control frames count those that ask for
    # nothing (PRIORITY, idle WINDOW_UPDATEs, empty DATA / CONTINUATION, unsolicited PING ACKs...)
    max_resets_per_sec: int = 100
    max_settings_per_sec: int = 10
    max_control_frames_per_sec: int = 100


@dataclass(frozen=True, slots=True)
class AccessOptions:
    """Who may call the HTTP and gRPC APIs: Triton's restricted API groups, naiad's bearer
    token, and naiad's HTTPS files (gRPC TLS is in GrpcOptions)."""

    # API group → (header, value) a request to it must carry (frontends/access.py parses them)
    http_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_restricted: dict[str, tuple[str, str]] = field(default_factory=dict)
    auth_token: str = ""  # "": no bearer token asked
    auth_health: bool = False  # the token also guards the health group (else probes stay open)
    http_ssl_cert: str = ""
    http_ssl_key: str = ""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: tuple[Path | str, ...]  # str: an s3:// gs:// as:// URL (naiad.repository.location)
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    model_config_name: str | None = None
    auto_complete_config: bool = True
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    model_load_thread_count: int = 4
    # naiad's own (core.residency): a request for a repository model that is not loaded loads it
    model_load_on_demand: bool = False
    # naiad's own: host bytes resident models may take; least recently used idle ones are
    # evicted to make room (0: no budget)
    model_memory_budget: int = 0
    default_max_batch_size: int = 4
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    # naiad's own: a request's headers and body (or a new connection's first request) must arrive
    # within this many seconds of its first byte, else 408 and close (slow clients); 0 = no limit
    http_read_timeout_secs: float = 60.0
    http_header_forward_pattern: str = ""
    # naiad's own: after this many responses a keep-alive connection is closed (Connection: close)
    # so clients reconnect and spread over replicas; 0 = no limit
    http_max_requests_per_connection: int = 0
    console: bool = True  # naiad's own: the web console at / on the HTTP port (--console)
    # naiad's own (nginx's keepalive_timeout): a keep-alive connection with no request for this
    # long is closed; 0 = no limit
    http_idle_timeout_secs: float = 75.0
    # naiad's own (nginx's worker_connections): HTTP and gRPC connections open at once; at the
    # limit the longest-idle connection makes room, else the newcomer is refused (HTTP 503,
    # gRPC GOAWAY) and closed. Capped by the open-file limit; 0 = no limit
    max_connections: int = 4096
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc: GrpcOptions = field(default_factory=GrpcOptions)
    allow_client_shm: bool = False
    allow_metrics: bool = True
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True  # NVML's GPU families, where a GPU and its driver are
    metrics_address: str | None = None  # None: the HTTP address
    metrics_port: int = 8002
    metrics_config: dict[str, str] = field(default_factory=dict)  # --metrics-config key=value
    trace_settings: dict[str, str | list[str]] = field(default_factory=dict)  # from --trace-config
    trace_opentelemetry: dict[str, str] | None = None  # OpenTelemetry mode's options; None: Triton mode
    rate_limit: str = "off"  # off | execution_count
    rate_limit_resources: dict[tuple[str, int | None], int] = field(default_factory=dict)
    server_id: str = "triton"
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    response_cache_bytes: int = 0  # --cache-config local,size=N; 0: no response cache
    access: AccessOptions = field(default_factory=AccessOptions)
