// mlxcel's chat page: streams /v1/chat/completions into the conversation. Every text from the
// server or the user reaches the page through textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const els = {
  model: $("model"),
  status: $("status"),
  system: $("system"),
  temperature: $("temperature"),
  apiKey: $("api-key"),
  messages: $("messages"),
  composer: $("composer"),
  input: $("input"),
  send: $("send"),
  stop: $("stop"),
  clear: $("clear"),
};

// The conversation as the API takes it (the system prompt is added per request).
let history = [];
let controller = null;
let modelName = null;

// Settings survive a reload: the system prompt and temperature in localStorage, the API key only
// for this tab (sessionStorage).
for (const [el, store, key] of [
  [els.system, localStorage, "mlxcel.system"],
  [els.temperature, localStorage, "mlxcel.temperature"],
  [els.apiKey, sessionStorage, "mlxcel.apiKey"],
]) {
  const saved = store.getItem(key);
  if (saved !== null) el.value = saved;
  el.addEventListener("change", () => store.setItem(key, el.value));
}
els.apiKey.addEventListener("change", loadModel);

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = els.apiKey.value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text, error = false) {
  els.status.textContent = text;
  els.status.classList.toggle("error", error);
}

async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error || body;
    return `${response.status}: ${error.message || JSON.stringify(body)}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      els.model.textContent = "?";
      setStatus(
        response.status === 401
          ? "this server needs an API key (Settings)"
          : await errorText(response),
        true,
      );
      return;
    }
    const list = await response.json();
    modelName = list.data[0].id;
    els.model.textContent = modelName;
    setStatus("ready");
  } catch (err) {
    setStatus(`cannot reach the server: ${err.message}`, true);
  }
}

function addMessage(role, text) {
  const box = document.createElement("div");
  box.className = `message ${role}`;
  const p = document.createElement("p");
  p.className = "text";
  p.textContent = text;
  box.append(p);
  els.messages.append(box);
  box.scrollIntoView({ block: "end" });
  return box;
}

function setStats(box, timings, usage) {
  let stats = box.querySelector(".stats");
  if (!stats) {
    stats = document.createElement("div");
    stats.className = "stats";
    box.append(stats);
  }
  const parts = [];
  if (timings) {
    parts.push(`${timings.predicted_n} tokens`);
    parts.push(`${timings.predicted_per_second.toFixed(1)} tok/s`);
    parts.push(`prompt ${timings.prompt_n} tokens in ${Math.round(timings.prompt_ms)} ms`);
    box.dataset.tokensPerSecond = timings.predicted_per_second.toFixed(2);
  } else if (usage) {
    parts.push(`${usage.completion_tokens} tokens`);
  }
  stats.textContent = parts.join(" · ");
}

function busy(on) {
  els.send.disabled = on;
  els.stop.disabled = !on;
  els.clear.disabled = on;
}

// Reads a server-sent event stream, calling onData with each event's parsed `data:` JSON.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const box = addMessage("assistant", "");
  box.classList.add("streaming");
  const out = box.querySelector(".text");
  const messages = [];
  const system = els.system.value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (modelName) body.model = modelName;
  const temperature = parseFloat(els.temperature.value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;

  controller = new AbortController();
  busy(true);
  setStatus("generating…");
  let answer = "";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        answer += delta.content;
        out.textContent = answer;
        box.scrollIntoView({ block: "end" });
      }
      if (chunk.timings || chunk.usage) setStats(box, chunk.timings, chunk.usage);
    });
    setStatus("ready");
  } catch (err) {
    if (err.name === "AbortError") {
      setStatus("stopped");
      box.dataset.stopped = "true";
    } else {
      box.classList.add("error");
      setStatus(err.message, true);
      if (!answer) out.textContent = err.message;
    }
  } finally {
    box.classList.remove("streaming");
    controller = null;
    busy(false);
    box.dataset.done = "true";
  }
  // A stopped answer stays in the conversation as far as it got.
  if (answer) history.push({ role: "assistant", content: answer });
}

els.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = els.input.value.trim();
  if (!text || controller) return;
  els.input.value = "";
  send(text);
});
els.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    els.composer.requestSubmit();
  }
});
els.stop.addEventListener("click", () => {
  if (controller) controller.abort();
});
els.clear.addEventListener("click", () => {
  history = [];
  els.messages.replaceChildren();
  setStatus("ready");
});

busy(false);
loadModel();
