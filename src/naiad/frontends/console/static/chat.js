// The Chat page: a playground for "llm" models over /v1/chat/completions, streamed (server-sent
// events), with the sampling settings and a JSON box for any other field of the OpenAI request
// (response_format, tools, ... as the server supports them).

import { request } from "./api.js";
import { compact } from "./charts.js";
import { element } from "./models.js";

const messages = []; // the conversation sent with each turn: {role, content}
let running = null; // the AbortController of the answer being streamed

function settings(form) {
  const body = {};
  for (const [field, parse] of [["temperature", Number], ["top_p", Number], ["max_tokens", Number], ["seed", Number]]) {
    const value = form.querySelector(`[name=${field}]`).value.trim();
    if (value !== "") body[field] = parse(value);
  }
  const extra = form.querySelector("[name=extra]").value.trim();
  if (extra) {
    try {
      Object.assign(body, JSON.parse(extra));
    } catch (error) {
      throw new Error(`extra fields: not JSON (${error.message})`);
    }
  }
  return body;
}

function bubble(role, text) {
  const node = element("div", { class: `message ${role}`, "data-role": role },
    element("div", { class: "role" }, role), element("div", { class: "content" }, text));
  document.querySelector("#chat-log").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

// Each `data: {...}` event of the stream, as parsed JSON; stops at `data: [DONE]`.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(event, status) {
  event.preventDefault();
  const form = event.target;
  const model = document.querySelector("#chat-model").value;
  const input = form.querySelector("[name=message]");
  const text = input.value.trim();
  if (!model || !text || running) return;
  let body;
  try {
    body = settings(form);
  } catch (error) {
    status(error.message, true);
    return;
  }
  const system = form.querySelector("[name=system]").value.trim();
  messages.push({ role: "user", content: text });
  bubble("user", text);
  input.value = "";
  const answer = bubble("assistant", "");
  const content = answer.querySelector(".content");
  answer.dataset.state = "streaming";
  answer.dataset.chunks = "0";
  running = new AbortController();
  form.querySelector("[name=stop]").disabled = false;
  const started = performance.now();
  let first = null;
  let usage = null;
  let reply = "";
  try {
    const response = await request("/v1/chat/completions", { method: "POST", signal: running.signal, body: {
      ...body, model, stream: true, stream_options: { include_usage: true },
      messages: [...(system ? [{ role: "system", content: system }] : []), ...messages] } });
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(error.error?.message || error.error || response.statusText);
    }
    for await (const chunk of events(response)) {
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices?.[0]?.delta?.content;
      if (!delta) continue;
      first ??= performance.now();
      reply += delta;
      content.textContent = reply;
      answer.dataset.chunks = String(Number(answer.dataset.chunks) + 1);
      answer.scrollIntoView({ block: "end" });
    }
    answer.dataset.state = "done";
  } catch (error) {
    answer.dataset.state = error.name === "AbortError" ? "stopped" : "error";
    if (error.name !== "AbortError") status(`chat: ${error.message}`, true);
  } finally {
    running = null;
    form.querySelector("[name=stop]").disabled = true;
  }
  messages.push({ role: "assistant", content: reply });
  const seconds = (performance.now() - started) / 1000;
  const tokens = usage ? usage.completion_tokens : null;
  const decode = first !== null && tokens ? tokens / Math.max(1e-3, (performance.now() - first) / 1000) : null;
  answer.append(element("div", { class: "stats" }, [
    first !== null ? `first token ${compact(first - started)} ms` : null,
    tokens !== null ? `${tokens} tokens` : null,
    decode !== null ? `${compact(decode)} tokens/s` : null,
    `${compact(seconds)} s`,
  ].filter(Boolean).join(" · ")));
}

export function setChatModels(names) {
  const select = document.querySelector("#chat-model");
  const current = [...select.options].map((option) => option.value);
  if (current.join() === names.join()) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((name) => element("option", { value: name }, name)));
  if (names.includes(chosen)) select.value = chosen;
  document.querySelector("#chat-empty").hidden = names.length > 0;
}

export function chooseChatModel(name) {
  if (name) document.querySelector("#chat-model").value = name;
}

export function initChat(status) {
  const form = document.querySelector("#chat-form");
  form.addEventListener("submit", (event) => send(event, status));
  form.querySelector("[name=message]").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.querySelector("[name=stop]").addEventListener("click", () => running?.abort());
  form.querySelector("[name=clear]").addEventListener("click", () => {
    running?.abort();
    messages.length = 0;
    document.querySelector("#chat-log").replaceChildren();
  });
}
