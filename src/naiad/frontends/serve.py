"""Run the server: load models, serve HTTP, poll the repository, drain on SIGTERM / Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import FrameType

import uvicorn

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.errors import NaiadError
from naiad.frontends.http.app import HttpApp
from naiad.observability.logs import LogSettings

log = logging.getLogger(__name__)


class _HttpServer(uvicorn.Server):
    """uvicorn that marks the server not-ready the moment a stop signal arrives, before draining."""

    def __init__(self, config: uvicorn.Config, server: InferenceServer) -> None:
        super().__init__(config)
        self.inference_server = server

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.inference_server.stopping = True
        super().handle_exit(sig, frame)


async def run(options: ServerOptions, log_settings: LogSettings) -> int:
    """Serve until a stop signal; returns the process exit status."""
    server = InferenceServer(options, log_settings)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, server.start)
    except NaiadError as error:
        log.error("%s", error)
        await loop.run_in_executor(None, server.stop)
        return 1
    poller = asyncio.create_task(_poll(server)) if options.model_control_mode == "poll" else None
    try:
        await _serve_http(server, options)
    finally:
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        await loop.run_in_executor(None, server.stop)
    log.info("exiting")
    return 0


async def _serve_http(server: InferenceServer, options: ServerOptions) -> None:
    if not options.allow_http:
        stop = asyncio.Event()
        await stop.wait()  # nothing to serve here yet without HTTP; wait for cancellation
        return
    config = uvicorn.Config(
        HttpApp(server, options.http_max_input_size),
        host=options.http_address,
        port=options.http_port,
        loop="none",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        backlog=4096,
        timeout_keep_alive=60,
        timeout_graceful_shutdown=int(options.exit_timeout_secs),
    )
    log.info("Started HTTPService at %s:%d", options.http_address, options.http_port)
    await _HttpServer(config, server).serve()


async def _poll(server: InferenceServer) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(server.options.repository_poll_secs)
        try:
            await loop.run_in_executor(None, server.models.poll)
        except Exception:
            log.exception("repository poll failed")
