// mlxcel's chat page: conversations saved in the browser, each turn streamed from
// /v1/chat/completions and rendered as markdown. Every text from the server or the user reaches
// the page through textContent and text nodes, never as HTML.
import * as api from "./api.js";
import { DEFAULT_MAX_TOKENS, initSettings, requestParams, systemPrompt } from "./settings.js";
import * as store from "./store.js";
import { copyText, editInPlace, messageView, setStatsText, statsText, updateMessage } from "./view.js";

const $ = (id) => document.getElementById(id);
const els = {
  model: $("model"),
  status: $("status"),
  messages: $("messages"),
  composer: $("composer"),
  input: $("input"),
  send: $("send"),
  stop: $("stop"),
  clear: $("clear"),
  list: $("conversation-list"),
  attach: $("attach"),
  attachments: $("pending-attachments"),
  exportButton: $("export"),
  importFile: $("import-file"),
};

/** Text files larger than this are refused: they would not fit a small model's context. */
const MAX_ATTACHMENT_BYTES = 512 * 1024;

let conversation = store.newConversation();
let controller = null;
// From a send until its answer is saved: no second send, edit or switch meanwhile.
let working = false;
let pending = [];

function setStatus(text, error = false) {
  els.status.textContent = text;
  els.status.classList.toggle("error", error);
}

function busy(on) {
  working = on;
  els.send.disabled = on;
  els.stop.disabled = !on;
  els.clear.disabled = on;
  for (const b of document.querySelectorAll("#messages .action-edit, #messages .action-regenerate, #conversation-list button")) {
    b.disabled = on;
  }
}

async function loadModels() {
  try {
    const ids = await api.models();
    els.model.replaceChildren(
      ...ids.map((id) => {
        const option = document.createElement("option");
        option.value = id;
        option.textContent = id;
        return option;
      }),
    );
    const saved = localStorage.getItem("mlxcel.model");
    if (saved && ids.includes(saved)) els.model.value = saved;
    setStatus("ready");
  } catch (err) {
    els.model.replaceChildren();
    if (err.status === 401) setStatus("this server needs an API key (Settings)", true);
    else if (err.status) setStatus(err.message, true);
    else setStatus(`cannot reach the server: ${err.message}`, true);
  }
}

// The API's content of a user turn: its text, then each attached file in a fenced block.
function apiContent(message) {
  let content = message.content;
  for (const a of message.attachments || []) {
    content += `\n\n${a.name}:\n\`\`\`\n${a.text}\n\`\`\``;
  }
  return content;
}

function render() {
  els.messages.replaceChildren(...conversation.messages.map((m, i) => messageView(m, i)));
}

async function persist() {
  if (!conversation.messages.length) return;
  conversation.updated = Date.now();
  if (!conversation.title) {
    const first = conversation.messages.find((m) => m.role === "user");
    conversation.title = first ? first.content.replace(/\s+/g, " ").trim().slice(0, 60) || "(files)" : "";
  }
  await store.save(conversation);
  localStorage.setItem("mlxcel.current", conversation.id);
  await renderList();
}

async function renderList() {
  const all = await store.list();
  els.list.replaceChildren(
    ...all.map((c) => {
      const item = document.createElement("li");
      item.dataset.id = c.id;
      if (c.id === conversation.id) item.className = "current";
      const open = document.createElement("button");
      open.type = "button";
      open.className = "open";
      open.textContent = c.title || "(untitled)";
      open.title = new Date(c.updated).toLocaleString();
      const rename = document.createElement("button");
      rename.type = "button";
      rename.className = "rename";
      rename.textContent = "✎";
      rename.title = "rename";
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "delete";
      remove.textContent = "✕";
      remove.title = "delete";
      item.append(open, rename, remove);
      return item;
    }),
  );
  busy(working);
}

async function openConversation(id) {
  const found = id && (await store.get(id));
  conversation = found || store.newConversation();
  if (found) localStorage.setItem("mlxcel.current", id);
  render();
  await renderList();
}

// Streams an answer to the conversation as it stands (its last message is the user's).
async function generate() {
  const message = { role: "assistant", content: "" };
  conversation.messages.push(message);
  const index = conversation.messages.length - 1;
  const box = messageView(message, index);
  box.dataset.done = "false";
  box.classList.add("streaming");
  els.messages.append(box);
  box.scrollIntoView({ block: "end" });

  const messages = [];
  const system = systemPrompt();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conversation.messages.slice(0, index)) {
    messages.push({ role: m.role, content: m.role === "user" ? apiContent(m) : m.content });
  }
  controller = new AbortController();
  setStatus("generating…");
  let frame = 0;
  const redraw = () => {
    frame = 0;
    updateMessage(box, message);
    box.scrollIntoView({ block: "end" });
  };
  try {
    const body = { messages, ...requestParams() };
    if (els.model.value) body.model = els.model.value;
    const finish = await api.streamChat(
      body,
      controller.signal,
      (delta) => {
        if (delta.reasoning_content) message.reasoning = (message.reasoning || "") + delta.reasoning_content;
        if (delta.content) message.content += delta.content;
        if (!frame) frame = requestAnimationFrame(redraw);
      },
      (timings, usage) => {
        message.stats = statsText(timings, usage);
        setStatsText(box, message.stats);
        if (timings) box.dataset.tokensPerSecond = timings.predicted_per_second.toFixed(2);
      },
    );
    setStatus(finish === "length" ? `stopped at max tokens (${body.max_tokens ?? "the server's limit"})` : "ready");
  } catch (err) {
    if (err.name === "AbortError") {
      setStatus("stopped");
      box.dataset.stopped = "true";
    } else {
      box.classList.add("error");
      setStatus(err.message, true);
      if (!message.content) box.querySelector(".text").textContent = err.message;
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    if (message.content || message.reasoning) updateMessage(box, message);
    box.classList.remove("streaming");
    controller = null;
    box.dataset.done = "true";
  }
  // A stopped answer stays in the conversation as far as it got; a failed one goes.
  if (!message.content && !message.reasoning) {
    conversation.messages.pop();
    if (!box.classList.contains("error")) box.remove();
  }
  await persist();
}

// Runs one turn (`work` ends with an answer generated) with the controls disabled, then counts
// it in `data-turns` on the body (the browser check waits on it).
async function turn(work) {
  busy(true);
  try {
    await work();
  } finally {
    busy(false);
    document.body.dataset.turns = String(Number(document.body.dataset.turns || 0) + 1);
  }
}

function sendMessage(text) {
  return turn(async () => {
    const message = { role: "user", content: text };
    if (pending.length) message.attachments = pending;
    pending = [];
    els.attachments.replaceChildren();
    conversation.messages.push(message);
    els.messages.append(messageView(message, conversation.messages.length - 1));
    await persist();
    await generate();
  });
}

async function onMessageAction(event) {
  const target = event.target.closest("button");
  if (!target) return;
  if (target.dataset.copy === "code") {
    const code = target.parentElement.querySelector("code");
    if (await copyText(code.textContent)) flash(target, "Copied");
    return;
  }
  const box = target.closest(".message");
  if (!box || !target.dataset.action || working) return;
  const index = Number(box.dataset.index);
  const message = conversation.messages[index];
  if (!message) return;
  if (target.dataset.action === "copy") {
    if (await copyText(message.content)) flash(target, "Copied");
  } else if (target.dataset.action === "regenerate") {
    await turn(async () => {
      conversation.messages.length = index;
      render();
      await generate();
    });
  } else if (target.dataset.action === "edit") {
    editInPlace(box, message, async (text) => {
      if (working) return;
      if (message.role === "user") {
        // An edited question is asked again: the turns after it go.
        await turn(async () => {
          conversation.messages.length = index;
          conversation.messages.push({ ...message, content: text });
          render();
          await persist();
          await generate();
        });
      } else {
        message.content = text;
        updateMessage(box, message);
        await persist();
      }
    });
  }
}

function flash(button, text) {
  const before = button.textContent;
  button.textContent = text;
  setTimeout(() => (button.textContent = before), 1200);
}

async function onListClick(event) {
  const target = event.target.closest("button");
  const item = target && target.closest("li");
  if (!item || working) return;
  const id = item.dataset.id;
  if (target.classList.contains("open")) {
    await openConversation(id);
  } else if (target.classList.contains("rename")) {
    renameInPlace(item);
  } else if (target.classList.contains("delete")) {
    // Two clicks delete: the first asks, the second (within 4 s) confirms.
    if (target.dataset.confirming !== "true") {
      target.dataset.confirming = "true";
      target.textContent = "Delete?";
      setTimeout(() => {
        target.dataset.confirming = "false";
        target.textContent = "✕";
      }, 4000);
      return;
    }
    await store.remove(id);
    if (id === conversation.id) await openConversation(null);
    else await renderList();
  }
}

// The title becomes a text field: Enter or leaving it saves, Escape cancels.
function renameInPlace(item) {
  const open = item.querySelector(".open");
  const field = document.createElement("input");
  field.className = "rename-field";
  field.value = open.textContent === "(untitled)" ? "" : open.textContent;
  open.replaceWith(field);
  field.focus();
  field.select();
  let done = false;
  const finish = async (keep) => {
    if (done) return;
    done = true;
    const title = field.value.trim();
    const saved = await store.get(item.dataset.id);
    if (keep && title && saved) {
      saved.title = title;
      await store.save(saved);
      if (saved.id === conversation.id) conversation.title = title;
    }
    await renderList();
  };
  field.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") finish(false);
  });
  field.addEventListener("blur", () => finish(true));
}

async function exportConversations() {
  const blob = new Blob([await store.exportAll()], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `mlxcel-chats-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

async function importConversations() {
  const file = els.importFile.files[0];
  els.importFile.value = "";
  if (!file) return;
  try {
    const n = await store.importAll(await file.text());
    setStatus(`imported ${n} conversation${n === 1 ? "" : "s"}`);
    await renderList();
  } catch (err) {
    setStatus(`import of ${file.name} failed: ${err.message}`, true);
  }
}

// Text files only: a file that is not UTF-8 text (a NUL byte, or undecodable) is refused by name.
async function addAttachments() {
  for (const file of els.attach.files) {
    if (file.size > MAX_ATTACHMENT_BYTES) {
      setStatus(`${file.name}: over ${MAX_ATTACHMENT_BYTES / 1024} KiB, not attached`, true);
      continue;
    }
    const bytes = new Uint8Array(await file.arrayBuffer());
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      text = null;
    }
    if (text === null || text.includes("\u0000")) {
      setStatus(`${file.name}: not a text file (only text files can be attached)`, true);
      continue;
    }
    pending.push({ name: file.name, text });
    const chip = document.createElement("span");
    chip.className = "attachment";
    chip.textContent = `📄 ${file.name}`;
    els.attachments.append(chip);
  }
  els.attach.value = "";
}

els.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = els.input.value.trim();
  if ((!text && !pending.length) || working) return;
  els.input.value = "";
  sendMessage(text);
});
els.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    els.composer.requestSubmit();
  }
});
els.stop.addEventListener("click", () => {
  if (controller) controller.abort();
});
els.clear.addEventListener("click", () => {
  localStorage.removeItem("mlxcel.current");
  openConversation(null);
  setStatus("ready");
});
els.model.addEventListener("change", () => localStorage.setItem("mlxcel.model", els.model.value));
els.messages.addEventListener("click", onMessageAction);
els.list.addEventListener("click", onListClick);
els.exportButton.addEventListener("click", exportConversations);
els.importFile.addEventListener("change", importConversations);
els.attach.addEventListener("change", addAttachments);
if (!localStorage.getItem("mlxcel.max-tokens")) $("max-tokens").value = String(DEFAULT_MAX_TOKENS);

initSettings(loadModels);
busy(false);
loadModels();
openConversation(localStorage.getItem("mlxcel.current")).then(() => {
  document.body.dataset.ready = "true";
});
