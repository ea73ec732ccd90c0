"""Prometheus metrics with Triton's names, types and labels (SPEC §5), served at /metrics.

Everything is read at scrape time from the counters the statistics API already keeps, so an
inference pays nothing for metrics. The text is written here rather than by
`prometheus_client`: its exposition renames every counter to `<name>_total` (and adds
`_created` series), while dashboards built on Triton scrape `nv_inference_request_success`
itself. Labels are printed sorted by name, as Triton's prometheus-cpp does (QA regexes rely
on `{model="m",reason="REJECTED",version="1"}`).

`--metrics-config` switches the µs counters off and the per-phase summaries and the
first-response histogram on (statistics.LatencySettings); a model's `model_metrics` sets its
own buckets and its `metric_tags` add labels. Backends add their own families (the llm
backend's token, latency and KV-cache metrics). The response-cache families are printed only for
versions the cache serves (server and config both enable it), as Triton does. GPU families come
from NVML (observability.gpu_metrics) when --allow-gpu-metrics and a GPU are there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from naiad.observability.custom_metrics import CustomMetrics
from naiad.observability.gpu_metrics import GpuSampler, load_nvml
from naiad.observability.statistics import FAILURE_REASONS, ModelStatistics, Snapshot

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, slots=True)
class MetricRow:
    """One sample of a backend's own metric: a counter or gauge value, or a histogram
    (`buckets` holds cumulative (upper bound, count) pairs ending with "+Inf", `value` the sum)."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    buckets: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ModelSample:
    """What one loaded model version contributes: its counters, its queue depth now, and its
    backend's own metrics (`MetricRow`s without the model and version labels)."""

    stats: ModelStatistics
    pending: int
    extra: tuple[MetricRow, ...] = ()


#: (name, type, help) of the per-model families, in Triton's order
_COUNTERS = [
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds "
                                         "(includes cached requests)"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds "
                                       "(includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds "
                                               "(does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds "
                                               "(does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in "
                                                "microseconds (does not include cached requests)"),
]
#: Triton's response-cache counters (printed with the latency counters, for cached versions only)
_CACHE_COUNTERS = [
    ("nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds"),
]
_DURATIONS = {
    "nv_inference_request_duration_us": "success",
    "nv_inference_queue_duration_us": "queue",
    "nv_inference_compute_input_duration_us": "compute_input",
    "nv_inference_compute_infer_duration_us": "compute_infer",
    "nv_inference_compute_output_duration_us": "compute_output",
}


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, doc: str, samples: Iterable[tuple[str, float | int]]) -> Iterator[str]:
    rows = list(samples)
    if not rows:
        return
    yield f"# HELP {name} {doc}"
    yield f"# TYPE {name} {kind}"
    for labels, value in rows:
        yield f"{name}{labels} {_number(value)}"


def _number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


_SUMMARIES = {
    "request": ("nv_inference_request_summary_us", "Summary of inference request duration in microseconds "
                                                   "(includes cached requests)"),
    "queue": ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds "
                                               "(includes cached requests)"),
    "compute_input": ("nv_inference_compute_input_summary_us", "Summary of compute input duration in "
                                                               "microseconds (does not include cached requests)"),
    "compute_infer": ("nv_inference_compute_infer_summary_us", "Summary of compute inference duration in "
                                                               "microseconds (does not include cached requests)"),
    "compute_output": ("nv_inference_compute_output_summary_us", "Summary of inference compute output duration "
                                                                 "in microseconds (does not include cached "
                                                                 "requests)"),
    "cache_hit": ("nv_cache_hit_summary_per_model", "Summary of cache hit duration per model, in microseconds"),
    "cache_miss": ("nv_cache_miss_summary_per_model", "Summary of cache miss duration per model, in microseconds"),
}
_FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"


def render_models(samples: list[ModelSample]) -> Iterator[str]:
    """The per-model families for the loaded versions."""
    snapshots = [(sample, sample.stats.snapshot()) for sample in samples]
    yield from _render_counters(samples, snapshots)
    yield from _render_summaries(samples)
    yield from _render_histograms(samples)
    yield from _family("nv_model_load_duration_secs", "gauge", "Model load time in seconds",
                       [(_labels(**s.stats.metric_labels), s.stats.load_duration_s)
                        for s in samples if s.stats.load_duration_s is not None])
    yield from _render_backend_rows(samples)


def _render_backend_rows(samples: list[ModelSample]) -> Iterator[str]:
    """The backends' own families, each printed once with every model's samples."""
    yield from render_rows((row, sample.stats.metric_labels) for sample in samples for row in sample.extra)


def render_rows(rows: Iterable[tuple[MetricRow, dict[str, str]]]) -> Iterator[str]:
    """Rows (each with labels of its own beside `row.labels`) as families, each printed once."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for row, own in rows:
        labels = {**own, **dict(row.labels)}
        _, _, lines = families.setdefault(row.name, (row.kind, row.help, []))
        if row.kind != "histogram":
            lines.append(f"{row.name}{_labels(**labels)} {_number(row.value)}")
            continue
        lines.extend(f"{row.name}_bucket{_labels(le=bound, **labels)} {count}" for bound, count in row.buckets)
        lines.append(f"{row.name}_sum{_labels(**labels)} {_number(row.value)}")
        lines.append(f"{row.name}_count{_labels(**labels)} {row.buckets[-1][1] if row.buckets else 0}")
    for name, (kind, doc, lines) in families.items():
        yield f"# HELP {name} {doc}"
        yield f"# TYPE {name} {kind}"
        yield from lines


def _render_summaries(samples: list[ModelSample]) -> Iterator[str]:
    now = time.monotonic_ns()
    rows: dict[str, list[str]] = {key: [] for key in _SUMMARIES}
    for sample in samples:
        tags = sample.stats.metric_labels
        for key, quantiles, count, total in sample.stats.summary_rows(now):
            name = _SUMMARIES[key][0]
            rows[key].extend(f"{name}{_labels(quantile=_number(q), **tags)} {_number(v)}"
                             for q, v in quantiles)
            rows[key].append(f"{name}_sum{_labels(**tags)} {_number(total)}")
            rows[key].append(f"{name}_count{_labels(**tags)} {count}")
    for key, (name, doc) in _SUMMARIES.items():
        if rows[key]:
            yield f"# HELP {name} {doc}"
            yield f"# TYPE {name} summary"
            yield from rows[key]


def _render_histograms(samples: list[ModelSample]) -> Iterator[str]:
    lines: list[str] = []
    for sample in samples:
        histogram = sample.stats.histogram_rows()
        if histogram is None:
            continue
        buckets, count, total = histogram
        tags = sample.stats.metric_labels
        lines.extend(f"{_FIRST_RESPONSE}_bucket{_labels(le=bound, **tags)} {n}"
                     for bound, n in buckets)
        lines.append(f"{_FIRST_RESPONSE}_sum{_labels(**tags)} {_number(total)}")
        lines.append(f"{_FIRST_RESPONSE}_count{_labels(**tags)} {count}")
    if lines:
        yield f"# HELP {_FIRST_RESPONSE} Duration from request to first response in milliseconds"
        yield f"# TYPE {_FIRST_RESPONSE} histogram"
        yield from lines


def _render_counters(samples: list[ModelSample], snapshots: list[tuple[ModelSample, Snapshot]]) -> Iterator[str]:
    for name, doc in _COUNTERS:
        if name in _DURATIONS and not all(sample.stats.latency.counters for sample in samples):
            continue  # --metrics-config counter_latencies=false
        rows: list[tuple[str, float | int]] = []
        for sample, snap in snapshots:
            tags = sample.stats.metric_labels
            if name == "nv_inference_request_success":
                rows.append((_labels(**tags), snap.success))
            elif name == "nv_inference_request_failure":
                rows.extend((_labels(reason=reason, **tags), snap.failures[reason])
                            for reason in FAILURE_REASONS)
            elif name == "nv_inference_count":
                rows.append((_labels(**tags), snap.inference_count))
            elif name == "nv_inference_exec_count":
                rows.append((_labels(**tags), snap.execution_count))
            else:
                ns = snap.durations_ns[_DURATIONS[name]]
                if name == "nv_inference_request_duration_us":
                    ns += snap.durations_ns["fail"]  # end to end covers failed requests too, as Triton
                rows.append((_labels(**tags), ns // 1000))
        yield from _family(name, "counter", doc, rows)
        if name == "nv_inference_compute_output_duration_us":
            yield from _render_cache_counters(snapshots)
        if name == "nv_inference_exec_count":
            yield from _family("nv_inference_pending_request_count", "gauge",
                               "Instantaneous number of pending requests awaiting execution per-model.",
                               [(_labels(**s.stats.metric_labels), s.pending)
                                for s in samples])


def _render_cache_counters(snapshots: list[tuple[ModelSample, Snapshot]]) -> Iterator[str]:
    cached = [(sample.stats.metric_labels, snap) for sample, snap in snapshots if sample.stats.cache_enabled]
    values = {
        "nv_cache_num_hits_per_model": lambda snap: snap.cache_hits,
        "nv_cache_hit_duration_per_model": lambda snap: snap.durations_ns["cache_hit"] // 1000,
        "nv_cache_num_misses_per_model": lambda snap: snap.cache_misses,
        "nv_cache_miss_duration_per_model": lambda snap: snap.durations_ns["cache_miss"] // 1000,
    }
    for name, doc in _CACHE_COUNTERS:
        yield from _family(name, "counter", doc, [(_labels(**tags), values[name](snap)) for tags, snap in cached])


class CpuSampler:
    """nv_cpu_utilization over the time since the previous scrape (0..1, all cores), and the
    host's memory, from /proc as Triton reads them."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last = self._times()
        self._lock = threading.Lock()

    def _times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs, or None where /proc/stat is not readable."""
        try:
            fields = (self.proc / "stat").read_text().splitlines()[0].split()[1:]
        except (OSError, IndexError):
            return None
        values = [int(field) for field in fields[:8]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    def utilization(self) -> float:
        with self._lock:
            now, last = self._times(), self._last
            self._last = now
        if now is None or last is None or now[1] <= last[1]:
            return 0.0
        return (now[0] - last[0]) / (now[1] - last[1])

    def memory(self) -> tuple[int, int]:
        """(total, used) bytes; used is total minus MemAvailable."""
        info: dict[str, int] = {}
        try:
            for line in (self.proc / "meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return 0, 0
        total = info.get("MemTotal", 0)
        return total, total - info.get("MemAvailable", info.get("MemFree", 0))

    def render(self) -> Iterator[str]:
        total, used = self.memory()
        yield from _family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]",
                           [("", self.utilization())])
        yield from _family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes", [("", total)])
        yield from _family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes", [("", used)])


class Metrics:
    """The whole /metrics page: per-model families, the families models created (custom metrics),
    then the GPU's and CPU's (when allowed)."""

    def __init__(self, samples: Callable[[], list[ModelSample]], cpu: bool = True, gpu: bool = False,
                 custom: CustomMetrics | None = None, rows: Callable[[], list[MetricRow]] | None = None) -> None:
        self.samples = samples
        self.custom = custom
        self.rows = rows  # the server's own rows (model residency), beside the per-version ones
        self.cpu = CpuSampler() if cpu else None
        nvml = load_nvml() if gpu else None
        self.gpu = GpuSampler(nvml) if nvml is not None else None

    def text(self) -> bytes:
        lines = list(render_models(self.samples()))
        if self.rows is not None:
            lines.extend(render_rows((row, {}) for row in self.rows()))
        if self.custom is not None:
            lines.extend(self.custom.render())
        if self.gpu is not None:
            lines.extend(self.gpu.render(_family, _labels))
        if self.cpu is not None:
            lines.extend(self.cpu.render())
        return ("\n".join(lines) + "\n").encode() if lines else b""


class MetricsServer:
    """GET /metrics on its own port and thread (Triton's --metrics-port, 8002 by default)."""

    def __init__(self, metrics: Metrics, address: str, port: int) -> None:
        page = metrics

        class Handler(BaseHTTPRequestHandler):
            # Each connection has a thread: one that sends nothing for this long is dropped, so
            # silent connections cannot pile threads up (a scrape takes milliseconds).
            timeout = 30

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "Not Found")
                    return
                body = page.text()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes are not worth a log line each

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()
        log.info("Started Metrics Service at %s:%d", self._server.server_address[0], self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

