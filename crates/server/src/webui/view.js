// One message of the conversation as the page shows it: the user's text as written, the
// assistant's as markdown with its reasoning in a collapsed block of its own, attachments, the
// statistics line, and the Copy / Edit / Regenerate buttons (their `data-action` says which; the
// page handles the clicks).
import { renderMarkdown } from "./markdown.js";

const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

function button(action, label, title) {
  const b = el("button", `action action-${action}`, label);
  b.type = "button";
  b.dataset.action = action;
  b.title = title;
  return b;
}

/** A new element for `message`, the `index`-th of its conversation. */
export function messageView(message, index) {
  const box = el("div", `message ${message.role}`);
  box.dataset.index = String(index);
  if (message.role === "assistant") {
    const reasoning = el("details", "reasoning");
    reasoning.append(el("summary", "", "Reasoning"), el("div", "reasoning-text"));
    reasoning.hidden = true;
    box.append(reasoning, el("div", "text"));
  } else {
    box.append(el("p", "text"));
  }
  if (message.attachments && message.attachments.length) {
    const files = el("div", "attachments");
    for (const a of message.attachments) {
      const chip = el("span", "attachment", `📄 ${a.name}`);
      chip.title = `${a.text.length} characters`;
      files.append(chip);
    }
    box.append(files);
  }
  const actions = el("div", "actions");
  actions.append(button("copy", "Copy", "copy this message's text"));
  actions.append(button("edit", "Edit", message.role === "user" ? "edit and send again" : "edit this answer"));
  if (message.role === "assistant") actions.append(button("regenerate", "Regenerate", "answer this turn again"));
  box.append(actions);
  updateMessage(box, message);
  if (message.stats) setStatsText(box, message.stats);
  box.dataset.done = "true";
  return box;
}

/** Shows `message`'s current text (and reasoning) in `box`, re-rendering the markdown. */
export function updateMessage(box, message) {
  const text = box.querySelector(".text");
  if (message.role === "assistant") {
    text.replaceChildren(renderMarkdown(message.content));
    const reasoning = box.querySelector(".reasoning");
    reasoning.hidden = !message.reasoning;
    if (message.reasoning) {
      box.querySelector(".reasoning-text").textContent = message.reasoning;
      reasoning.querySelector("summary").textContent = message.content
        ? `Reasoning (${message.reasoning.length} characters)`
        : "Thinking…";
    }
  } else {
    text.textContent = message.content;
  }
}

/** The statistics line from the stream's final `timings` (llama-server's) or `usage`. */
export function statsText(timings, usage) {
  const parts = [];
  if (timings) {
    parts.push(`${timings.predicted_n} tokens`);
    parts.push(`${timings.predicted_per_second.toFixed(1)} tok/s`);
    parts.push(`prompt ${timings.prompt_n} tokens in ${Math.round(timings.prompt_ms)} ms`);
  } else if (usage) {
    parts.push(`${usage.completion_tokens} tokens`);
  }
  return parts.join(" · ");
}

export function setStatsText(box, text) {
  let stats = box.querySelector(".stats");
  if (!stats) {
    stats = el("div", "stats");
    box.querySelector(".actions").before(stats);
  }
  stats.textContent = text;
}

/** Replaces the message's text with an editor; `onSave(text)` runs on Save, Cancel restores. */
export function editInPlace(box, message, onSave) {
  const text = box.querySelector(".text");
  const editor = el("div", "editor");
  const area = el("textarea");
  area.value = message.content;
  area.rows = Math.min(16, Math.max(3, message.content.split("\n").length + 1));
  const save = el("button", "edit-save", message.role === "user" ? "Send" : "Save");
  save.type = "button";
  const cancel = el("button", "edit-cancel", "Cancel");
  cancel.type = "button";
  const buttons = el("div", "buttons");
  buttons.append(save, cancel);
  editor.append(area, buttons);
  text.hidden = true;
  text.after(editor);
  area.focus();
  cancel.addEventListener("click", () => {
    editor.remove();
    text.hidden = false;
  });
  save.addEventListener("click", () => {
    editor.remove();
    text.hidden = false;
    onSave(area.value);
  });
}

/** Copies `text` to the clipboard (the Clipboard API, else a selected text area). */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = el("textarea");
    area.value = text;
    area.className = "offscreen";
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}
