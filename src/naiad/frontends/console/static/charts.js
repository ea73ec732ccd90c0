// Small canvas charts for the console: a time-series line chart and a bar chart.
// No library: the console must work offline and stay light.

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];
let firstChartMarked = false;

export function color(index) {
  return PALETTE[index % PALETTE.length];
}

// 1234 -> "1.23k"; values under 10 keep two significant decimals.
export function compact(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const size = Math.abs(value);
  for (const [limit, suffix] of [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]]) {
    if (size >= limit) return (value / limit).toFixed(value / limit >= 100 ? 0 : 1) + suffix;
  }
  if (size === 0) return "0";
  if (size < 10) return value.toFixed(size < 1 ? 3 : 2).replace(/\.?0+$/, "");
  return value.toFixed(size < 100 ? 1 : 0);
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

function markFirstChart() {
  // The page's "time to first chart" (bench/console.py reads it).
  if (firstChartMarked) return;
  firstChartMarked = true;
  performance.mark("naiad-first-chart");
}

class Chart {
  constructor(parent, title, unit, id) {
    this.figure = document.createElement("figure");
    this.figure.className = "chart";
    if (id) this.figure.dataset.chart = id;
    const caption = document.createElement("figcaption");
    caption.textContent = title + (unit ? ` (${unit})` : "");
    this.canvas = document.createElement("canvas");
    this.legend = document.createElement("div");
    this.legend.className = "legend";
    this.figure.append(caption, this.canvas, this.legend);
    parent.append(this.figure);
    this.unit = unit;
    new ResizeObserver(() => this.draw()).observe(this.canvas);
  }

  // The canvas sized to its box, in device pixels; the context scaled to CSS pixels.
  context() {
    const ratio = window.devicePixelRatio || 1;
    const width = this.canvas.clientWidth;
    const height = this.canvas.clientHeight;
    if (!width || !height) return null;
    if (this.canvas.width !== Math.round(width * ratio)) this.canvas.width = Math.round(width * ratio);
    if (this.canvas.height !== Math.round(height * ratio)) this.canvas.height = Math.round(height * ratio);
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, width, height };
  }

  axes(ctx, box, max, format) {
    ctx.strokeStyle = getComputedStyle(this.canvas).getPropertyValue("--grid") || "#ddd";
    ctx.fillStyle = getComputedStyle(this.canvas).getPropertyValue("--ink-soft") || "#666";
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 4; i++) {
      const y = box.top + (box.height * i) / 4;
      ctx.beginPath();
      ctx.moveTo(box.left, Math.round(y) + 0.5);
      ctx.lineTo(box.left + box.width, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(format(max * (1 - i / 4)), box.left - 4, y);
    }
  }
}

// A time series of one or more lines over the last `span` seconds.
export class LineChart extends Chart {
  constructor(parent, { id, title, unit = "", series = [], span = 120, format = compact }) {
    super(parent, title, unit, id);
    this.span = span;
    this.format = format;
    this.points = []; // [seconds, [value or null per series]]
    this.setSeries(series);
  }

  setSeries(labels) {
    if (this.labels && labels.join("\u0000") === this.labels.join("\u0000")) return;
    const old = this.labels || [];
    this.points = this.points.map(([t, values]) => [t, labels.map((label) => {
      const at = old.indexOf(label);
      return at < 0 ? null : values[at];
    })]);
    this.labels = labels;
  }

  push(seconds, values) {
    this.points.push([seconds, values]);
    while (this.points.length && this.points[0][0] < seconds - this.span) this.points.shift();
    const latest = {};
    this.labels.forEach((label, i) => { latest[label] = values[i]; });
    this.canvas.dataset.latest = JSON.stringify(latest);  // what the tests read
    this.canvas.dataset.max = String(Math.max(0, ...this.points.flatMap(([, v]) => v.filter((x) => x !== null))));
    this.draw();
  }

  draw() {
    const drawn = this.context();
    if (!drawn) return;
    const { ctx, width, height } = drawn;
    const box = { left: 44, top: 6, width: width - 52, height: height - 24 };
    const values = this.points.flatMap(([, v]) => v.filter((x) => x !== null && Number.isFinite(x)));
    const max = niceMax(Math.max(0, ...values));
    this.axes(ctx, box, max, this.format);
    const end = this.points.length ? this.points[this.points.length - 1][0] : 0;
    const x = (t) => box.left + box.width * (1 - (end - t) / this.span);
    const y = (v) => box.top + box.height * (1 - v / max);
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    ctx.fillText(`${this.span}s`, box.left + 10, box.top + box.height + 4);
    ctx.fillText("now", box.left + box.width - 10, box.top + box.height + 4);
    ctx.lineWidth = 1.6;
    this.labels.forEach((label, i) => {
      ctx.strokeStyle = color(i);
      ctx.beginPath();
      let open = false;
      for (const [t, v] of this.points) {
        const value = v[i];
        if (value === null || !Number.isFinite(value)) { open = false; continue; }
        if (open) ctx.lineTo(x(t), y(value)); else ctx.moveTo(x(t), y(value));
        open = true;
      }
      ctx.stroke();
    });
    if (values.length) markFirstChart();
    const last = this.points.length ? this.points[this.points.length - 1][1] : [];
    this.legend.replaceChildren(...this.labels.map((label, i) => {
      const item = document.createElement("span");
      item.style.setProperty("--swatch", color(i));
      item.textContent = `${label} ${this.format(last[i] ?? null)}`;
      return item;
    }));
  }
}

// Bars by category (e.g. executions by batch size).
export class BarChart extends Chart {
  constructor(parent, { id, title, unit = "", format = compact }) {
    super(parent, title, unit, id);
    this.format = format;
    this.bars = []; // [label, value]
  }

  set(bars) {
    this.bars = bars;
    this.canvas.dataset.latest = JSON.stringify(Object.fromEntries(bars));
    this.draw();
  }

  draw() {
    const drawn = this.context();
    if (!drawn) return;
    const { ctx, width, height } = drawn;
    const box = { left: 44, top: 6, width: width - 52, height: height - 24 };
    const max = niceMax(Math.max(0, ...this.bars.map(([, v]) => v)));
    this.axes(ctx, box, max, this.format);
    if (!this.bars.length) {
      this.legend.textContent = "no executions yet";
      return;
    }
    const slot = box.width / this.bars.length;
    const barWidth = Math.max(2, Math.min(48, slot * 0.7));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    this.bars.forEach(([label, value], i) => {
      const h = (box.height * value) / max;
      const left = box.left + slot * i + (slot - barWidth) / 2;
      ctx.fillStyle = color(0);
      ctx.fillRect(left, box.top + box.height - h, barWidth, h);
      ctx.fillStyle = getComputedStyle(this.canvas).getPropertyValue("--ink-soft") || "#666";
      if (this.bars.length <= 32 || i % Math.ceil(this.bars.length / 32) === 0) {
        ctx.fillText(String(label), box.left + slot * i + slot / 2, box.top + box.height + 4);
      }
    });
    if (this.bars.some(([, v]) => v > 0)) markFirstChart();
    this.legend.textContent = "";
  }
}
