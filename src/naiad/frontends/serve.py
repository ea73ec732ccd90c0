"""Run the server: load models, serve HTTP, poll the repository, drain on SIGTERM / Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from types import FrameType

import uvicorn

from naiad.config.options import ServerOptions
from naiad.core.server import InferenceServer
from naiad.errors import NaiadError
from naiad.frontends.http.app import HttpApp
from naiad.observability.logs import LogSettings

log = logging.getLogger(__name__)


class _HttpServer(uvicorn.Server):
    """uvicorn that drains like Triton: on a stop signal the server turns not-ready but keeps
    answering HTTP until in-flight inferences finish (or --exit-timeout-secs passes); only then
    does uvicorn stop listening."""

    def __init__(self, config: uvicorn.Config, server: InferenceServer, drain_secs: float) -> None:
        super().__init__(config)
        self.inference_server = server
        self.drain_secs = drain_secs
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not calling super(): uvicorn would re-raise the signal after serving, killing the
        # process by signal before the models unload and the exit status is 0.
        self.inference_server.stopping = True
        if self.drain_deadline is None:
            self.drain_deadline = time.monotonic() + self.drain_secs
        else:  # a second signal: stop waiting
            self.should_exit = True
            self.force_exit = sig == signal.SIGINT

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and (
            self.inference_server.inflight == 0 or time.monotonic() >= self.drain_deadline
        ):
            self.should_exit = True
        return await super().on_tick(counter)


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
    await _HttpServer(config, server, options.exit_timeout_secs).serve()


async def _poll(server: InferenceServer) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(server.options.repository_poll_secs)
        try:
            await loop.run_in_executor(None, server.models.poll)
        except Exception:
            log.exception("repository poll failed")
