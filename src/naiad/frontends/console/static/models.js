// The Models page: the repository index with each model's backend, instances, batching and
// labels, load / reload / unload buttons (the repository API) and the config as config.pbtxt.

import { json, modelPath, text } from "./api.js";

const details = new Map(); // model name -> {key, config, labels}: fetched again when its versions change
let controlMode = "";

export function setControlMode(mode) {
  controlMode = mode;
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

export { element };

function batching(config) {
  if (!config) return "";
  const parts = [];
  if (config.max_batch_size > 0) parts.push(`max batch ${config.max_batch_size}`);
  else parts.push("no batching");
  const dynamic = config.dynamic_batching;
  if (dynamic) {
    const preferred = (dynamic.preferred_batch_size || []).join(", ");
    const delay = Number(dynamic.max_queue_delay_microseconds || 0);
    parts.push(`dynamic${preferred ? ` [${preferred}]` : ""}${delay ? `, ${delay} µs` : ""}`);
  }
  if (config.sequence_batching) parts.push("sequence");
  if (config.ensemble_scheduling) parts.push("ensemble");
  if (config.model_transaction_policy && config.model_transaction_policy.decoupled) parts.push("decoupled");
  return parts.join(" · ");
}

function instances(config) {
  if (!config || !config.instance_group || !config.instance_group.length) return "";
  return config.instance_group.map((group) => {
    const kind = (group.kind || "KIND_AUTO").replace("KIND_", "").toLowerCase();
    return `${group.count || 1} × ${kind}`;
  }).join(", ");
}

function labels(found) {
  if (!found) return "";
  const table = Object.entries(found.labels || {}).map(([label, version]) => `${label}→${version}`);
  const split = Object.entries(found.split || {}).map(([label, weight]) => `${label} ${weight}`);
  return [table.join(", "), split.length ? `split: ${split.join(", ")}` : ""].filter(Boolean).join(" · ");
}

export function backendOf(config) {
  return config ? config.backend || config.platform || "" : "";
}

async function fetchDetails(name, entries) {
  const key = entries.map((e) => `${e.version}:${e.state}`).join(",");
  const held = details.get(name);
  if (held && held.key === key) return held;
  const ready = entries.some((e) => e.state === "READY");
  const found = { key, config: null, labels: null };
  if (ready) {
    const [config, labelTable] = await Promise.allSettled([
      json(`${modelPath(name)}/config`), json(`${modelPath(name)}/labels`)]);
    found.config = config.status === "fulfilled" ? config.value : null;
    found.labels = labelTable.status === "fulfilled" ? labelTable.value : null;
  }
  details.set(name, found);
  return found;
}

export function modelDetails(name) {
  return details.get(name);
}

export async function refreshModels(status) {
  const index = await json("/v2/repository/index", { method: "POST", body: {} });
  const byName = new Map();
  for (const entry of index) {
    if (!byName.has(entry.name)) byName.set(entry.name, []);
    byName.get(entry.name).push(entry);
  }
  const found = await Promise.all([...byName].map(([name, entries]) => fetchDetails(name, entries)));
  const body = document.querySelector("#models tbody");
  const rows = [];
  [...byName].forEach(([name, entries], i) => {
    entries.forEach((entry, j) => rows.push(row(name, entry, j === 0 ? entries.length : 0, found[i], status)));
  });
  body.replaceChildren(...rows);
  document.querySelector("#models-count").textContent =
    `${byName.size} models, ${index.filter((e) => e.state === "READY").length} versions ready`;
  return { names: [...byName.keys()], ready: index.filter((e) => e.state === "READY").map((e) => e.name) };
}

function row(name, entry, span, found, status) {
  const state = entry.state || "NOT LOADED"; // the index lists models never loaded without a state
  const tr = element("tr", { "data-model": name, "data-version": entry.version || "" });
  if (span) {
    const link = element("a", { href: `#try/${encodeURIComponent(name)}` }, name);
    tr.append(element("td", { rowSpan: span, class: "name" }, link));
  }
  tr.append(
    element("td", { class: "version" }, entry.version || "–"),
    element("td", { class: "state" }, element("span", { class: `badge ${state.toLowerCase()}` }, state)),
    element("td", { class: "reason" }, entry.reason || ""),
  );
  if (span) {
    const config = found.config;
    tr.append(
      element("td", { rowSpan: span }, backendOf(config)),
      element("td", { rowSpan: span }, instances(config)),
      element("td", { rowSpan: span }, batching(config)),
      element("td", { rowSpan: span }, labels(found.labels)),
      element("td", { rowSpan: span, class: "actions" }, ...actions(name, entry, found, status)),
    );
  }
  return tr;
}

function actions(name, entry, found, status) {
  const ready = found.key.includes(":READY");
  const explicit = controlMode === "explicit";
  const why = explicit ? "" : "load and unload need --model-control-mode=explicit";
  const titles = { Load: `load ${name}`, Reload: `load ${name} again (picks up changes in the repository)`,
    Unload: `unload ${name}` };
  const button = (label, action, enabled) => {
    const node = element("button", { type: "button", "data-action": action, disabled: !enabled || !explicit,
      title: why || titles[label] }, label);
    node.addEventListener("click", () => control(name, action, status));
    return node;
  };
  const config = element("button", { type: "button", "data-action": "config", disabled: !found.config,
    title: "the config as config.pbtxt" }, "Config");
  config.addEventListener("click", () => showConfig(name));
  return [button(ready ? "Reload" : "Load", "load", true), button("Unload", "unload", ready), config];
}

async function control(name, action, status) {
  for (const node of document.querySelectorAll(`#models tr[data-model="${CSS.escape(name)}"] button`)) {
    node.disabled = true;
  }
  status(`${action === "load" ? "Loading" : "Unloading"} ${name}…`);
  try {
    await json(`/v2/repository/models/${encodeURIComponent(name)}/${action}`, { method: "POST", body: {} });
    status(`${name}: ${action === "load" ? "loaded" : "unloaded"}`);
  } catch (error) {
    status(`${name}: ${error.message}`, true);
  }
  details.delete(name);
  await refreshModels(status);
}

async function showConfig(name) {
  const dialog = document.getElementById("config-dialog");
  dialog.querySelector("h2").textContent = `${name} — config.pbtxt`;
  const pre = dialog.querySelector("pre");
  pre.textContent = "…";
  dialog.showModal();
  try {
    pre.textContent = await text(`/console/api/models/${encodeURIComponent(name)}/config.pbtxt`);
  } catch (error) {
    pre.textContent = error.message;
  }
}
