"""naiad as a Ray Serve deployment: each replica runs `naiad serve` and forwards V2 HTTP to it.

    from ray import serve
    from naiad.integrations.ray_serve import build_app

    serve.run(build_app("/models", min_replicas=1, max_replicas=3, target_ongoing_requests=2), route_prefix="/")

Clients talk to Serve's HTTP proxy exactly as to naiad (tritonclient.http, curl, the binary-tensor
extension): a replica sends the request's method, path, query, headers and body to its own naiad
on 127.0.0.1 and returns naiad's status, headers and body unchanged (bytes, not re-encoded;
compressed bodies stay compressed). Event streams (generate_stream, the OpenAI API's stream) are
passed through as they arrive. Serve scales the replicas on their ongoing requests
(`autoscaling_config`); a replica's health check is naiad's GET /v2/health/ready.

Why a child process per replica and not naiad's HTTP app in the replica itself: see
`naiad_process`. The extra hop is one loopback connection, kept alive by a pooled session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import aiohttp
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("naiad.integrations.ray_serve needs Ray Serve: pip install 'naiad[ray]'") from error

from naiad.integrations.naiad_process import NaiadProcess, check_naiad_args

#: Headers of one connection, not of the message (RFC 9110 7.6.1), or recomputed by the next hop.
_HOP_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
    "host", "content-length",
})

DEFAULT_AUTOSCALING: dict[str, Any] = {
    "min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 2,
    "upscale_delay_s": 5.0, "downscale_delay_s": 60.0,
}


def _forwardable(headers: Any) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers.items() if name.lower() not in _HOP_HEADERS]


@serve.deployment(name="naiad", health_check_period_s=5, health_check_timeout_s=10)
class NaiadDeployment:
    """One replica: a `naiad serve` on `repository` with `naiad_args`, and a proxy to it."""

    def __init__(self, repository: str, naiad_args: Sequence[str] = (), startup_timeout: float = 120.0) -> None:
        self.naiad = NaiadProcess(repository, naiad_args, startup_timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on Serve's event loop (the first request's), not in __init__'s thread.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                self.naiad.url, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):  # a route prefix other than "/"
            path = path[len(root):] or "/"
        if request.url.query:
            path = f"{path}?{request.url.query}"
        body = await request.body()
        try:
            upstream = await self._client().request(
                request.method, path, data=body, headers=_forwardable(request.headers), allow_redirects=False
            )
        except aiohttp.ClientConnectionError as error:
            # naiad answers every request it reads, errors included: a dropped connection means it
            # ended or closed it. Say which, with its log, which goes with the replica otherwise.
            state = await asyncio.to_thread(self.naiad.describe, 1.0)
            raise RuntimeError(f"the request to this replica's naiad failed ({error!r}): {state}") from error
        response: Response
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            response = StreamingResponse(_relay(upstream), status_code=upstream.status)
        else:
            async with upstream:
                response = Response(await upstream.read(), status_code=upstream.status)
        for name, value in _forwardable(upstream.headers):  # append: a repeated header stays repeated
            response.headers.append(name, value)
        return response

    async def check_health(self) -> None:
        """Serve's health check: the replica is healthy while its naiad is ready."""
        if self.naiad.process.poll() is not None:
            raise RuntimeError(f"naiad serve exited with code {self.naiad.process.returncode}")
        if not await asyncio.to_thread(self.naiad.ready):
            raise RuntimeError("naiad is not ready (GET /v2/health/ready)")

    def __del__(self) -> None:  # Serve's graceful stop of a replica
        naiad = getattr(self, "naiad", None)
        if naiad is not None:
            naiad.stop()


async def _relay(upstream: aiohttp.ClientResponse) -> Any:
    async with upstream:
        async for chunk in upstream.content.iter_any():
            yield chunk


def build_app(
    repository: str | Path,
    naiad_args: Sequence[str] = (),
    *,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    target_ongoing_requests: float | None = None,
    autoscaling_config: Mapping[str, Any] | None = None,
    num_cpus: float = 1.0,
    startup_timeout: float = 120.0,
    **deployment_options: Any,
) -> serve.Application:
    """The deployment, bound to `repository` (a path every node can read) and naiad's own CLI
    flags `naiad_args` (e.g. ["--model-control-mode", "explicit", "--load-model", "m"]).

    Autoscaling: `autoscaling_config` is Serve's (upscale_delay_s, downscale_delay_s, ...),
    over `DEFAULT_AUTOSCALING`; min_replicas, max_replicas and target_ongoing_requests, when
    given, override it. `num_cpus` is each replica's Ray CPU reservation; `deployment_options`
    go to `Deployment.options` (max_ongoing_requests, ray_actor_options, ...)."""
    args = check_naiad_args(naiad_args)
    scaling = {**DEFAULT_AUTOSCALING, **(autoscaling_config or {})}
    overrides = {"min_replicas": min_replicas, "max_replicas": max_replicas,
                 "target_ongoing_requests": target_ongoing_requests}
    scaling.update({key: value for key, value in overrides.items() if value is not None})
    if not 0 <= scaling["min_replicas"] <= scaling["max_replicas"] or scaling["max_replicas"] < 1:
        raise ValueError(
            f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
            f"min_replicas={scaling['min_replicas']} max_replicas={scaling['max_replicas']}"
        )
    actor_options = {"num_cpus": num_cpus, **deployment_options.pop("ray_actor_options", {})}
    deployment = NaiadDeployment.options(  # type: ignore[attr-defined]  # made a Deployment by @serve.deployment
        autoscaling_config=scaling, ray_actor_options=actor_options, **deployment_options
    )
    return deployment.bind(str(repository), args, startup_timeout)
