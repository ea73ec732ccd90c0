"""ServerOptions: everything the command line decides, as one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model_repositories: tuple[Path, ...]
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    model_config_name: str | None = None
    auto_complete_config: bool = True
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    model_load_thread_count: int = 4
    default_max_batch_size: int = 4
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = 64 * 1024 * 1024
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_metrics: bool = True
    metrics_address: str | None = None
    metrics_port: int = 8002
    server_id: str = "triton"
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
