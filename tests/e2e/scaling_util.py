"""Helpers for the scaling tests: Prometheus scrapes of a real server's /metrics (and a wait on
its pending-request gauge) and a tiny round-robin TCP proxy standing in for a Kubernetes Service
in front of replicas."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(metrics_port: int) -> Samples:
    """Every sample of the /metrics page by the name the page writes (Triton's counters have no
    _total suffix, which Prometheus' own text parser adds), parsed with that parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if family.type == "counter" and sample.name == family.name + "_total" else sample.name
            samples.setdefault(name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels` (0 when there are none)."""
    return sum(value for series, value in samples.get(name, [])
               if all(series.get(key) == wanted for key, wanted in labels.items()))


def wait_pending(metrics_port: int, model: str, count: int, timeout: float = 30.0) -> None:
    """Wait until `model` has exactly `count` requests queued (nv_inference_pending_request_count):
    the server's own word that they arrived, where a sleep would only guess. A bound on the
    wait, never reached when things work."""
    deadline = time.monotonic() + timeout
    while (pending := total(scrape(metrics_port), "nv_inference_pending_request_count", model=model)) != count:
        assert time.monotonic() < deadline, f"{model}: {pending:.0f} requests pending after {timeout} s, not {count}"
        time.sleep(0.02)


class RoundRobinProxy:
    """Each new TCP connection goes to the next backend in turn (as kube-proxy spreads
    connections, not requests); bytes are piped both ways until either side closes."""

    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = backends
        self.connections: Counter[int] = Counter()  # backend index -> connections sent there
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _close(self) -> None:
        """Stop listening and close the sockets still open: their pipes then end on their own,
        so no task is left pending."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = next(self._turn) % len(self.backends)
        self.connections[index] += 1
        try:
            backend_reader, backend_writer = await asyncio.open_connection(*self.backends[index])
        except OSError:
            writer.close()
            return
        pair = {writer, backend_writer}
        self._writers |= pair
        try:
            await asyncio.gather(_pipe(reader, backend_writer), _pipe(backend_reader, writer))
        finally:
            self._writers -= pair


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
