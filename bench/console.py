"""What the web console weighs and what it costs the server, in one run:

    .venv/bin/python bench/console.py [--loads 5] [--rounds 2] [--browser] [--quick]

1. Page weight and first paint: a headless Chromium (Debian's, as the console's tests use) opens
   `/#metrics` with a cold cache `--loads` times; it reports the bytes transferred (gzip, headers
   included, from the Resource Timing API), the number of requests, the first contentful paint
   and the time to the first chart drawn with data (the page's `naiad-first-chart` mark), all
   from navigation start on loopback; and the size of one live-data poll.
2. The hot path: identity throughput at c=32 (perf_analyzer over HTTP, as bench/identity.py)
   with the console closed and open, alternating in each of `--rounds` rounds on one server.
   "open" polls `/console/api/live` every second as the page does, which also turns on the
   per-version latency windows; `--browser` makes it a real page in Chromium instead (which
   then competes with the server for the CPU on a small machine: that measures the browser,
   not the endpoint). Between rounds the script waits for the server to close the windows.
   The headline is open ÷ closed throughput (the issue asks for no measurable difference).

`--quick` checks the script end to end (one load, one round); its figures mean nothing.
Results go to .bench/results/console-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from harness import RESULTS_DIR, Server, ensure_peers, free_ports, start_server
from identity import NAIAD_BIN, NAIAD_REPO, PROTOCOLS, measure_once

CONCURRENCY = 32
IDLE_WAIT_S = 11.0  # the server drops its latency windows 10 s after the last poll (console/live.py)
_PAGE_FIGURES = """() => {
    const entries = [...performance.getEntriesByType("navigation"), ...performance.getEntriesByType("resource")];
    const paint = performance.getEntriesByName("first-contentful-paint")[0];
    const chart = performance.getEntriesByName("naiad-first-chart")[0];
    return {
        transfer_bytes: entries.reduce((sum, e) => sum + e.transferSize, 0),
        decoded_bytes: entries.reduce((sum, e) => sum + e.decodedBodySize, 0),
        requests: entries.length,
        first_paint_ms: paint ? paint.startTime : null,
        first_chart_ms: chart ? chart.startTime : null,
    };
}"""


def chromium() -> str:
    path = os.environ.get("NAIAD_CHROMIUM") or shutil.which("chromium") or shutil.which("google-chrome")
    if not path:
        raise SystemExit("no chromium: run `make browser` (tests/setup_browser.sh) or set NAIAD_CHROMIUM")
    return path


def start() -> Server:
    http, grpc, metrics = free_ports(3)
    argv = [str(NAIAD_BIN), "serve", f"--model-repository={NAIAD_REPO}", "--model-control-mode=explicit",
            "--load-model=identity", f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    return start_server("naiad-console", argv)


def page_figures(browser: Any, url: str, loads: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(loads):
        context = browser.new_context(viewport={"width": 1400, "height": 900})  # a cold cache each time
        page = context.new_page()
        page.goto(f"http://{url}/#metrics")
        page.wait_for_function("() => performance.getEntriesByName('naiad-first-chart').length > 0", timeout=30_000)
        rows.append(page.evaluate(_PAGE_FIGURES))
        context.close()
    return rows


def live_poll_bytes(url: str) -> int:
    with urllib.request.urlopen(f"http://{url}/console/api/live", timeout=10) as answer:
        return len(answer.read())


@contextmanager
def console_open(url: str, browser: Any | None) -> Iterator[None]:
    """The console open for the duration: a page in `browser`, else a poll a second."""
    if browser is not None:
        context = browser.new_context()
        context.new_page().goto(f"http://{url}/#metrics")
        try:
            yield
        finally:
            context.close()
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            with suppress(OSError):
                live_poll_bytes(url)

    live_poll_bytes(url)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield
    finally:
        stop.set()
        poller.join()


def throughput(server: Server, rounds: int, browser: Any | None) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {"closed": [], "open": []}
    proto = PROTOCOLS["http"]
    for round_index in range(rounds):
        if round_index:
            time.sleep(IDLE_WAIT_S)  # the last round's windows close
        m = measure_once(server, proto, CONCURRENCY, "INPUT0:16")
        if m:
            rates["closed"].append(m.infer_per_s)
        with console_open(server.url, browser):
            m = measure_once(server, proto, CONCURRENCY, "INPUT0:16")
        if m:
            rates["open"].append(m.infer_per_s)
    return rates


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loads", type=int, default=5, help="cold page loads measured")
    parser.add_argument("--rounds", type=int, default=2, help="closed / open throughput rounds")
    parser.add_argument("--browser", action="store_true", help="'open' is a real page in Chromium, not a poller")
    parser.add_argument("--quick", action="store_true", help="one load, one round: checks the script works")
    args = parser.parse_args(argv)
    if args.quick:
        args.loads, args.rounds = 1, 1
    from playwright.sync_api import sync_playwright

    ensure_peers()
    server = start()
    try:
        server.wait_ready(timeout_s=120)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(), headless=True)
            pages = page_figures(browser, server.url, args.loads)
            poll_bytes = live_poll_bytes(server.url)
            time.sleep(IDLE_WAIT_S)  # the pages' windows close before the first "closed" measurement
            rates = throughput(server, args.rounds, browser if args.browser else None)
            browser.close()
    finally:
        server.stop()
    summary = {key: median([row[key] for row in pages if row[key] is not None])
               for key in ("transfer_bytes", "decoded_bytes", "requests", "first_paint_ms", "first_chart_ms")}
    closed, opened = median(rates["closed"]), median(rates["open"])
    print(f"\nconsole page, median of {args.loads} cold load(s) of /#metrics on loopback")
    print("| transferred | decoded | requests | first paint | first chart | live poll |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {summary['transfer_bytes'] / 1024:.1f} KiB | {summary['decoded_bytes'] / 1024:.1f} KiB "
          f"| {summary['requests']:.0f} | {summary['first_paint_ms']:.0f} ms | {summary['first_chart_ms']:.0f} ms "
          f"| {poll_bytes / 1024:.1f} KiB |")
    print(f"\nidentity c={CONCURRENCY} (HTTP), median of {args.rounds} round(s); open = "
          f"{'a Chromium page' if args.browser else 'the live endpoint polled every second'}")
    print("| closed infer/s | open infer/s | open ÷ closed |\n|---:|---:|---:|")
    print(f"| {closed:,.0f} | {opened:,.0f} | {opened / closed:.3f} |")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"console-{time.strftime('%Y-%m-%dT%H%M%S')}.json"
    path.write_text(json.dumps({"page": summary, "loads": pages, "live_poll_bytes": poll_bytes,
                                "throughput": rates, "open_over_closed": opened / closed,
                                "open_is": "browser" if args.browser else "poller", "quick": args.quick}, indent=1))
    print(f"\nresults: {path}")
    return 0 if rates["closed"] and rates["open"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
