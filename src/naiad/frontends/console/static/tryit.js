// The Try it page: a form built from the model's metadata; tensors as JSON, or an image or an
// audio file for UINT8 / FP32 inputs whose shapes fit. The answer shows the outputs and the
// timeline of the request's trace (/console/api/models/{m}/infer traces it).

import { json, modelPath } from "./api.js";
import { compact } from "./charts.js";
import { element } from "./models.js";

const SHOWN_VALUES = 256; // values printed per output (the shape says how many there are)
const MAX_TYPED = 65536; // larger inputs are not pre-filled: a file, or a smaller shape
let metadata = null;

function concreteShape(shape) {
  return shape.map((dim) => (dim < 0 ? 1 : dim));
}

function count(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

function defaultText(datatype, n) {
  return n > MAX_TYPED ? "" : JSON.stringify(defaultData(datatype, n));
}

function defaultData(datatype, n) {
  if (datatype === "BYTES") return Array(n).fill("");
  if (datatype === "BOOL") return Array(n).fill(false);
  if (datatype.startsWith("FP") || datatype === "BF16") return Array(n).fill(0);
  const top = datatype === "UINT8" ? 256 : datatype === "INT8" ? 128 : 1 << 15;
  return Array.from({ length: n }, (_, i) => i % top);
}

// Where an image fits: dims after an optional batch dim are [H, W, 3] or [3, H, W].
function imageLayout(datatype, shape) {
  if (datatype !== "UINT8" && datatype !== "FP32") return null;
  const dims = shape.length === 4 ? shape.slice(1) : shape;
  if (dims.length !== 3) return null;
  if (dims[2] === 3) return { order: "HWC", height: dims[0], width: dims[1] };
  if (dims[0] === 3) return { order: "CHW", height: dims[1], width: dims[2] };
  return null;
}

// Where audio fits: FP32 samples, [N] or [B, N].
function audioFits(datatype, shape) {
  return datatype === "FP32" && (shape.length === 1 || (shape.length === 2 && shape[0] <= 1));
}

async function imageTensor(file, layout, shape, scale) {
  const bitmap = await createImageBitmap(file);
  const height = layout.height > 0 ? layout.height : bitmap.height;
  const width = layout.width > 0 ? layout.width : bitmap.width;
  const canvas = new OffscreenCanvas(width, height);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(bitmap, 0, 0, width, height);
  const rgba = ctx.getImageData(0, 0, width, height).data;
  const data = new Array(width * height * 3);
  const plane = width * height;
  for (let p = 0; p < plane; p++) {
    for (let c = 0; c < 3; c++) {
      const value = rgba[p * 4 + c] * scale;
      data[layout.order === "HWC" ? p * 3 + c : c * plane + p] = value;
    }
  }
  const dims = layout.order === "HWC" ? [height, width, 3] : [3, height, width];
  return { data, shape: shape.length === 4 ? [1, ...dims] : dims, note: `${file.name}, ${width}×${height}` };
}

async function audioTensor(file, shape, rate) {
  // An offline context decodes without an audio device (and resamples below).
  const decoded = await new OfflineAudioContext(1, 1, rate).decodeAudioData(await file.arrayBuffer());
  const frames = Math.ceil(decoded.duration * rate);
  const offline = new OfflineAudioContext(1, frames, rate);
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  let samples = Array.from((await offline.startRendering()).getChannelData(0));
  const fixed = shape[shape.length - 1];
  if (fixed > 0) samples = samples.slice(0, fixed).concat(Array(Math.max(0, fixed - samples.length)).fill(0));
  const dims = shape.length === 2 ? [1, samples.length] : [samples.length];
  return { data: samples, shape: dims, note: `${file.name}, ${samples.length} samples at ${rate} Hz` };
}

function inputField(spec) {
  const shape = concreteShape(spec.shape);
  const box = element("fieldset", { class: "tensor", "data-input": spec.name });
  box.append(element("legend", {}, `${spec.name} · ${spec.datatype} · [${spec.shape.join(", ")}]`));
  const shapeInput = element("input", { name: "shape", value: shape.join(","), title: "shape sent" });
  const data = element("textarea", { name: "data", rows: 3, spellcheck: false,
    value: defaultText(spec.datatype, count(shape)),
    placeholder: "too large to type: choose a file or a smaller shape" });
  box.append(element("label", {}, "shape ", shapeInput), element("label", { class: "data" }, "data (JSON) ", data));
  shapeInput.addEventListener("change", () => {
    const dims = shapeInput.value.split(",").map(Number);
    if (dims.every((d) => Number.isInteger(d) && d >= 0)) {
      data.value = defaultText(spec.datatype, count(dims));
    }
  });
  const layout = imageLayout(spec.datatype, spec.shape);
  const audio = audioFits(spec.datatype, spec.shape);
  if (layout || audio) {
    const file = element("input", { type: "file", accept: layout ? "image/*" : "audio/*" });
    const note = element("span", { class: "note" });
    const scale = element("select", {}, element("option", { value: "1" }, "0–255"),
      element("option", { value: String(1 / 255) }, "0–1"));
    const rate = element("input", { type: "number", value: 16000, min: 1000, step: 1000, title: "sample rate, Hz" });
    box.append(element("label", { class: "file" }, layout ? "or an image " : "or an audio file ", file,
      layout && spec.datatype === "FP32" ? scale : null, audio ? rate : null, note));
    file.addEventListener("change", async () => {
      if (!file.files.length) return;
      try {
        const tensor = layout
          ? await imageTensor(file.files[0], layout, spec.shape, Number(scale.value))
          : await audioTensor(file.files[0], spec.shape, Number(rate.value));
        box.tensor = tensor;
        shapeInput.value = tensor.shape.join(",");
        data.value = `[${tensor.data.length} values from ${tensor.note}]`;
        data.readOnly = true;
        note.textContent = tensor.note;
      } catch (error) {
        note.textContent = `cannot read the file: ${error.message}`;
      }
    });
  }
  return box;
}

function readInput(box, spec) {
  const shape = box.querySelector("[name=shape]").value.split(",").filter((d) => d.trim() !== "").map(Number);
  if (box.tensor) return { name: spec.name, datatype: spec.datatype, shape, data: box.tensor.data };
  let data;
  try {
    data = JSON.parse(box.querySelector("[name=data]").value);
  } catch (error) {
    throw new Error(`${spec.name}: the data is not JSON (${error.message})`);
  }
  return { name: spec.name, datatype: spec.datatype, shape, data: Array.isArray(data) ? data.flat(Infinity) : [data] };
}

export async function showModel(name, status) {
  const form = document.querySelector("#try-inputs");
  document.querySelector("#try-model").value = name;
  form.replaceChildren();
  document.querySelector("#try-outputs").replaceChildren();
  document.querySelector("#try-trace").replaceChildren();
  metadata = null;
  if (!name) return;
  try {
    metadata = await json(modelPath(name));
  } catch (error) {
    status(`${name}: ${error.message}`, true);
    return;
  }
  const versions = document.querySelector("#try-version");
  versions.replaceChildren(element("option", { value: "" }, "server's choice"),
    ...metadata.versions.map((version) => element("option", { value: version }, `version ${version}`)));
  form.append(...metadata.inputs.map(inputField));
  document.querySelector("#try-outputs-spec").textContent =
    `outputs: ${metadata.outputs.map((o) => `${o.name} ${o.datatype} [${o.shape.join(", ")}]`).join(" · ")}`;
}

async function send(event, status) {
  event.preventDefault();
  if (!metadata) return;
  const button = event.target.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const inputs = metadata.inputs.map((spec) =>
      readInput(document.querySelector(`#try-inputs [data-input="${CSS.escape(spec.name)}"]`), spec));
    const body = { inputs };
    const parameters = event.target.querySelector("[name=parameters]").value.trim();
    if (parameters) body.parameters = JSON.parse(parameters);
    const started = performance.now();
    const version = document.querySelector("#try-version").value;
    const path = `/console/api/models/${encodeURIComponent(metadata.name)}` +
      (version ? `/versions/${encodeURIComponent(version)}` : "");
    const answer = await json(`${path}/infer`, { method: "POST", body });
    const elapsed = performance.now() - started;
    showAnswer(answer, elapsed);
    status(answer.error ? `${metadata.name}: ${answer.error}` : `${metadata.name}: answered in ${compact(elapsed)} ms`,
      Boolean(answer.error));
  } catch (error) {
    status(error.message, true);
  } finally {
    button.disabled = false;
  }
}

function showAnswer(answer, elapsed) {
  const outputs = document.querySelector("#try-outputs");
  outputs.replaceChildren();
  answer.responses.forEach((response, i) => {
    if (answer.responses.length > 1) outputs.append(element("h4", {}, `response ${i + 1}`));
    for (const output of response.outputs || []) outputs.append(outputView(output));
  });
  if (answer.error) outputs.append(element("p", { class: "error" }, answer.error));
  showTrace(answer.trace, elapsed);
}

function outputView(output) {
  const data = output.data;
  const shown = data === undefined ? `(binary, ${output.parameters?.binary_data_size ?? "?"} bytes)`
    : JSON.stringify(data.slice(0, SHOWN_VALUES)) + (data.length > SHOWN_VALUES ? ` … ${data.length} values` : "");
  const view = element("div", { class: "output", "data-output": output.name });
  view.dataset.values = data === undefined ? "" : JSON.stringify(data.slice(0, 4096));
  view.append(element("div", { class: "head" }, `${output.name} · ${output.datatype} · [${output.shape.join(", ")}]`),
    element("pre", {}, shown));
  return view;
}

const PHASES = [
  ["HTTP receive", "HTTP_RECV_START", "HTTP_RECV_END"],
  ["decode", "HTTP_RECV_END", "REQUEST_START"],
  ["request", "REQUEST_START", "REQUEST_END"],
  ["queue", "QUEUE_START", "COMPUTE_START"],
  ["compute input", "COMPUTE_START", "COMPUTE_INPUT_END"],
  ["compute infer", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"],
  ["compute output", "COMPUTE_OUTPUT_START", "COMPUTE_END"],
];

function showTrace(stamps, elapsed) {
  const box = document.querySelector("#try-trace");
  box.replaceChildren();
  if (!stamps.length) {
    box.append(element("p", {}, "no trace"));
    return;
  }
  const at = Object.fromEntries(stamps.map(({ name, ns }) => [name, ns]));
  const start = stamps[0].ns;
  const span = Math.max(1, stamps[stamps.length - 1].ns - start);
  for (const [label, from, to] of PHASES) {
    if (!(from in at) || !(to in at)) continue;
    const bar = element("div", { class: "bar" });
    bar.style.left = `${(100 * (at[from] - start)) / span}%`;
    bar.style.width = `${Math.max(0.3, (100 * (at[to] - at[from])) / span)}%`;
    box.append(element("div", { class: "phase", "data-phase": label },
      element("span", { class: "label" }, label), element("span", { class: "track" }, bar),
      element("span", { class: "duration" }, `${compact((at[to] - at[from]) / 1000)} µs`)));
  }
  const list = stamps.map(({ name, ns }) => `+${compact((ns - start) / 1000).padStart(7)} µs  ${name}`);
  box.append(element("pre", { class: "stamps" },
    `${list.join("\n")}\n(server side ${compact(span / 1e6)} ms; round trip in the browser ${compact(elapsed)} ms)`));
}

export function initTry(status) {
  document.querySelector("#try-form").addEventListener("submit", (event) => send(event, status));
  document.querySelector("#try-model").addEventListener("change", (event) => {
    location.hash = `#try/${encodeURIComponent(event.target.value)}`;
  });
}
