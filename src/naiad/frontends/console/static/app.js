// The console's shell: pages by URL hash (#models, #metrics, #try/<model>, #chat/<model>), the
// live poll (one request a second) and the repository refresh (every few seconds, on #models).

import { forgetCredentials, json } from "./api.js";
import { chooseChatModel, initChat, setChatModels } from "./chat.js";
import { addLive, initMetrics } from "./metrics.js";
import { backendOf, element, modelDetails, refreshModels, setControlMode } from "./models.js";
import { initTry, showModel } from "./tryit.js";

const LIVE_MS = 1000;
const MODELS_MS = 5000; // the index lists the repository (maybe a bucket): not every second
let page = "models";
let tryModel = null;
let readyModels = [];

function status(message, error = false) {
  const line = document.querySelector("#status");
  line.textContent = message;
  line.classList.toggle("error", error);
}

function route() {
  const [name, argument] = (location.hash.slice(1) || "models").split("/");
  page = ["models", "metrics", "try", "chat"].includes(name) ? name : "models";
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== page;
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("current", link.getAttribute("href") === `#${page}`);
  }
  const model = argument ? decodeURIComponent(argument) : "";
  if (page === "try") {
    const chosen = model || tryModel || readyModels.find((name) => !isLlm(name)) || readyModels[0] || "";
    if (chosen !== tryModel) {
      tryModel = chosen;
      showModel(chosen, status);
    }
  }
  if (page === "chat") chooseChatModel(model);
}

function isLlm(name) {
  return backendOf(modelDetails(name)?.config) === "llm";
}

async function refresh() {
  try {
    const { ready } = await refreshModels(status);
    readyModels = [...new Set(ready)];
    const select = document.querySelector("#try-model");
    if ([...select.options].map((o) => o.value).join() !== readyModels.join()) {
      select.replaceChildren(...readyModels.map((name) => element("option", { value: name }, name)));
      if (tryModel) select.value = tryModel;
    }
    setChatModels(readyModels.filter(isLlm));
    if (page === "try" && !tryModel) route();
  } catch (error) {
    status(`repository index: ${error.message}`, true);
  }
}

async function pollLive() {
  if (!document.hidden) {
    try {
      const doc = await json("/console/api/live");
      setControlMode(doc.control_mode);
      addLive(doc);
    } catch (error) {
      status(`live data: ${error.message}`, true);
    }
  }
  setTimeout(pollLive, LIVE_MS);
}

async function pollModels() {
  if (page === "models" && !document.hidden) await refresh();
  setTimeout(pollModels, MODELS_MS);
}

async function start() {
  initMetrics();
  initTry(status);
  initChat(status);
  document.querySelector("#forget").addEventListener("click", () => {
    forgetCredentials();
    status("credentials forgotten");
  });
  document.querySelector("#models-refresh").addEventListener("click", refresh);
  window.addEventListener("hashchange", () => {
    route();
    if (page === "models") refresh();
  });
  try {
    const server = await json("/v2");
    document.querySelector("#server-info").textContent = `${server.name} · naiad ${server.version}`;
  } catch (error) {
    status(`server metadata: ${error.message}`, true);
  }
  // The first live document tells the control mode the models page's buttons depend on.
  try {
    const doc = await json("/console/api/live");
    setControlMode(doc.control_mode);
    addLive(doc);
  } catch (error) {
    status(`live data: ${error.message}`, true);
  }
  await refresh();
  route();
  setTimeout(pollLive, LIVE_MS);
  setTimeout(pollModels, MODELS_MS);
}

start();
