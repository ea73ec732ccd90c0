// The Metrics page: charts from /console/api/live, polled every second. The server sends
// cumulative counters; rates are differences between two polls, computed here.

import { BarChart, LineChart, compact } from "./charts.js";
import { element } from "./models.js";

const SPAN_S = 120; // seconds of history kept and drawn
const QUANTILE_POLLS = 5; // TTFT / ITL quantiles over the last this many polls
const history = []; // live documents, oldest first
let server = null; // the server-wide charts
let selected = ""; // "name/version" of the model whose charts are shown
let modelCharts = null;

const ms = (ns) => (ns === null || ns === undefined ? null : ns / 1e6);
const percent = (value) => `${compact(value)}%`;
const bytes = (value) => (value === null ? "–" : `${compact(value)}B`);

function key(model) {
  return `${model.name}/${model.version}`;
}

function find(doc, id) {
  return doc.models.find((model) => key(model) === id);
}

function rate(now, before, read) {
  if (!before) return null;
  const seconds = (now.time_ms - before.time_ms) / 1000;
  if (seconds <= 0) return null;
  const a = read(now);
  const b = read(before);
  return a === null || a === undefined || b === null || b === undefined ? null : Math.max(0, (a - b) / seconds);
}

// Prometheus-style quantile from the difference of two cumulative histograms.
function histogramQuantile(now, before, q) {
  if (!now) return null;
  const counts = now.buckets.map(([bound, count], i) => [bound, count - (before ? before.buckets[i][1] : 0)]);
  const total = counts.length ? counts[counts.length - 1][1] : 0;
  if (total <= 0) return null;
  const target = q * total;
  let lower = 0;
  let below = 0;
  for (const [bound, count] of counts) {
    if (count >= target) {
      if (bound === null) return lower; // the +Inf bucket: its lower edge
      return lower + ((bound - lower) * (target - below)) / Math.max(count - below, 1e-9);
    }
    if (bound !== null) lower = bound;
    below = count;
  }
  return lower;
}

function buildServerCharts() {
  const grid = document.querySelector("#server-charts");
  grid.replaceChildren();
  return {
    throughput: new LineChart(grid, { id: "throughput", title: "Throughput by model", unit: "req/s" }),
    cpu: new LineChart(grid, { id: "cpu", title: "CPU", unit: "% of all cores", series: ["host", "naiad"],
      format: percent }),
    memory: new LineChart(grid, { id: "memory", title: "Memory", series: ["host used", "naiad RSS"],
      format: bytes }),
  };
}

function buildModelCharts(model) {
  const grid = document.querySelector("#model-charts");
  grid.replaceChildren();
  const charts = {
    throughput: new LineChart(grid, { id: "model-throughput", title: "Throughput", unit: "/s",
      series: ["requests", "inferences", "executions"] }),
    latency: new LineChart(grid, { id: "latency", title: "Latency p50 / p99", unit: "ms",
      series: ["total p50", "total p99", "queue p50", "queue p99", "compute p50", "compute p99"] }),
    batches: new BarChart(grid, { id: "batches", title: "Executions by batch size, since load" }),
    failures: new LineChart(grid, { id: "failures", title: "Failures by reason", unit: "/s",
      series: ["REJECTED", "CANCELED", "BACKEND", "OTHER"] }),
    cache: new LineChart(grid, { id: "cache", title: model.cache ? "Response cache hit rate" :
      "Response cache hit rate (cache off for this model)", series: ["hits"], format: percent }),
    pending: new LineChart(grid, { id: "pending", title: "Queued requests", series: ["pending"] }),
  };
  if (model.llm) {
    charts.tokens = new LineChart(grid, { id: "tokens", title: "Tokens", unit: "/s",
      series: ["generated", "prompt"] });
    charts.ttft = new LineChart(grid, { id: "ttft", title: "Time to first token", unit: "ms",
      series: ["p50", "p99"] });
    charts.itl = new LineChart(grid, { id: "itl", title: "Inter-token latency", unit: "ms", series: ["p50", "p99"] });
    charts.kv = new LineChart(grid, { id: "kv", title: "KV cache and prefix cache", unit: "%",
      series: ["KV blocks used", "prefix hit rate"], format: percent });
  }
  return charts;
}

function drawServer(now, before) {
  const t = now.time_ms / 1000;
  const active = now.models.filter((model) => model.success > 0 || model.inferences > 0)
    .sort((a, b) => b.success - a.success).slice(0, 8);
  server.throughput.setSeries(active.map(key));
  server.throughput.push(t, active.map((model) => rate(now, before, (doc) => find(doc, key(model))?.success)));
  const system = now.system;
  const cores = system.cores || 1;
  const naiadCpu = rate(now, before, (doc) => doc.system.process_cpu_s);
  server.cpu.push(t, [system.cpu * 100, naiadCpu === null ? null : (100 * naiadCpu) / cores]);
  server.memory.push(t, [system.memory_used, system.process_rss]);
  const gpus = system.gpus.map((gpu) => `GPU ${gpu.uuid.slice(0, 12)}: ${compact((gpu.utilization || 0) * 100)}%, ` +
    `${bytes(gpu.memory_used)} / ${bytes(gpu.memory_total)}`);
  document.querySelector("#system-summary").textContent = [
    `${cores} cores, host CPU ${compact(system.cpu * 100)}%`,
    `naiad: ${system.processes} processes, RSS ${bytes(system.process_rss)}`,
    `host memory ${bytes(system.memory_used)} / ${bytes(system.memory_total)}`,
    ...(gpus.length ? gpus : ["no GPU"]),
  ].join(" · ");
}

function drawModel(now, before, older) {
  const model = find(now, selected);
  if (!model || !modelCharts) return;
  const t = now.time_ms / 1000;
  const read = (field) => (doc) => find(doc, selected)?.[field];
  modelCharts.throughput.push(t, [rate(now, before, read("success")), rate(now, before, read("inferences")),
    rate(now, before, read("executions"))]);
  const latency = model.latency;
  const pair = (field) => (latency ? latency[field].map(ms) : [null, null]);
  modelCharts.latency.push(t, [...pair("total"), ...pair("queue"), ...pair("compute")]);
  modelCharts.batches.set(model.batches.map(([size, count]) => [size, count]));
  modelCharts.failures.push(t, ["REJECTED", "CANCELED", "BACKEND", "OTHER"].map(
    (reason) => rate(now, before, (doc) => find(doc, selected)?.failures[reason])));
  let hitRate = null;
  const previous = before && find(before, selected);
  if (model.cache && previous && previous.cache) {
    const hits = model.cache.hits - previous.cache.hits;
    const lookups = hits + model.cache.misses - previous.cache.misses;
    hitRate = lookups > 0 ? (100 * hits) / lookups : null;
  }
  modelCharts.cache.push(t, [hitRate]);
  modelCharts.pending.push(t, [model.pending]);
  if (model.llm && modelCharts.tokens) {
    const llm = (field) => (doc) => find(doc, selected)?.llm?.[field];
    modelCharts.tokens.push(t, [rate(now, before, llm("generation_tokens")), rate(now, before, llm("prompt_tokens"))]);
    const past = older && find(older, selected)?.llm;
    const quantiles = (field) => [0.5, 0.99].map((q) => {
      const value = histogramQuantile(model.llm[field], past ? past[field] : null, q);
      return value === null ? null : value * 1000;
    });
    modelCharts.ttft.push(t, quantiles("ttft"));
    modelCharts.itl.push(t, quantiles("itl"));
    modelCharts.kv.push(t, [(model.llm.kv_cache_usage ?? 0) * 100, (model.llm.prefix_cache_hit_rate ?? 0) * 100]);
  }
}

function updateSelect(doc) {
  const select = document.querySelector("#metrics-model");
  const keys = doc.models.map(key);
  if (!selected || !keys.includes(selected)) {
    const busiest = [...doc.models].sort((a, b) => b.success - a.success)[0];
    selectModel(busiest ? key(busiest) : "");
  }
  const current = [...select.options].map((option) => option.value);
  if (current.join() !== keys.join()) {
    select.replaceChildren(...keys.map((value) => element("option", { value }, value)));
  }
  select.value = selected;
}

export function selectModel(id) {
  selected = id;
  const latest = history[history.length - 1];
  const model = latest && find(latest, id);
  modelCharts = model ? buildModelCharts(model) : null;
  document.querySelector("#metrics-model").value = id;
  // replay the history kept so far into the new charts
  history.forEach((doc, i) => drawModel(doc, history[i - 1] || null, history[Math.max(0, i - QUANTILE_POLLS)]));
}

export function initMetrics() {
  server = buildServerCharts();
  document.querySelector("#metrics-model").addEventListener("change", (event) => selectModel(event.target.value));
}

// Called with each live document (app.js polls).
export function addLive(doc) {
  const before = history[history.length - 1] || null;
  history.push(doc);
  while (history.length > SPAN_S + 1) history.shift();
  updateSelect(doc);
  // The first document draws the gauges (memory, queue...); rates need a second one.
  drawServer(doc, before);
  drawModel(doc, before, history[Math.max(0, history.length - 1 - QUANTILE_POLLS)]);
}
