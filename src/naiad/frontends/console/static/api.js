// Calls to the server's APIs with the credentials the user gave: the bearer token
// (--auth-token-file) and the headers of restricted API groups (--http-restricted-api).
// A 401 or 403 opens a prompt and the call is sent again with what was typed; both are kept in
// this tab's sessionStorage only.

const STORE = "naiad.console.credentials";
const credentials = JSON.parse(sessionStorage.getItem(STORE) || '{"token":"","headers":{}}');
let prompting = null; // one prompt at a time; concurrent refusals wait for it

function save() {
  sessionStorage.setItem(STORE, JSON.stringify(credentials));
}

export function forgetCredentials() {
  credentials.token = "";
  credentials.headers = {};
  save();
}

function ask(title, message, label, secret) {
  if (prompting) return prompting;
  const dialog = document.getElementById("credentials");
  dialog.querySelector("h2").textContent = title;
  dialog.querySelector("p").textContent = message;
  dialog.querySelector("label span").textContent = label;
  const input = dialog.querySelector("input");
  input.type = secret ? "password" : "text";
  input.value = "";
  prompting = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      prompting = null;
      resolve(dialog.returnValue === "ok" ? input.value.trim() : null);
    }, { once: true });
  });
  dialog.showModal();
  input.focus();
  return prompting;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const error = body.error;
    return typeof error === "string" ? error : (error && error.message) || text;
  } catch {
    return text || response.statusText;
  }
}

// fetch() with the credentials; prompts and retries on 401 / 403. Returns the Response.
export async function request(path, { method = "GET", body, signal } = {}) {
  for (;;) {
    const headers = { ...credentials.headers };
    if (credentials.token) headers.Authorization = `Bearer ${credentials.token}`;
    let payload = body;
    if (body !== undefined && typeof body !== "string") payload = JSON.stringify(body);
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, { method, headers, body: payload, signal });
    if (response.status === 401) {
      const message = await errorText(response);
      const token = await ask("Bearer token", `The server needs a token (${message}).`, "Token", true);
      if (token === null) throw new ApiError(401, message);
      credentials.token = token;
      save();
      continue;
    }
    if (response.status === 403) {
      const message = await errorText(response);
      const header = /expecting header '([^']+)'/.exec(message);
      if (!header) throw new ApiError(403, message);
      const value = await ask("Restricted API", message, `Value of ${header[1]}`, true);
      if (value === null) throw new ApiError(403, message);
      credentials.headers[header[1]] = value;
      save();
      continue;
    }
    return response;
  }
}

// The JSON answer of a call, or an ApiError with the server's message.
export async function json(path, options) {
  const response = await request(path, options);
  if (!response.ok) throw new ApiError(response.status, await errorText(response));
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

export async function text(path, options) {
  const response = await request(path, options);
  if (!response.ok) throw new ApiError(response.status, await errorText(response));
  return response.text();
}

export function modelPath(name, version) {
  const base = `/v2/models/${encodeURIComponent(name)}`;
  return version ? `${base}/versions/${encodeURIComponent(version)}` : base;
}
