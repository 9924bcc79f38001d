// The settings drawer: the system prompt, the token budget, every sampler the chat route takes,
// stop strings, the API key, and the colour theme. Each survives a reload (the key only in this
// tab). A sampler left blank is not sent, so the server's own default (its flags) applies.

const $ = (id) => document.getElementById(id);

/** The request fields the drawer sets: element id, request field, number kind. */
const SAMPLERS = [
  ["max-tokens", "max_tokens", "int"],
  ["temperature", "temperature", "float"],
  ["top-k", "top_k", "int"],
  ["top-p", "top_p", "float"],
  ["min-p", "min_p", "float"],
  ["typical-p", "typical_p", "float"],
  ["repeat-penalty", "repeat_penalty", "float"],
  ["repeat-last-n", "repeat_last_n", "int"],
  ["presence-penalty", "presence_penalty", "float"],
  ["frequency-penalty", "frequency_penalty", "float"],
  ["seed", "seed", "int"],
];

/** Without a budget a short question could run to the end of the context; this one bounds a
 * turn to about a page of text. */
export const DEFAULT_MAX_TOKENS = 1024;

const THEMES = ["system", "light", "dark"];

function persist(el, store, key) {
  const saved = store.getItem(key);
  if (saved !== null) el.value = saved;
  el.addEventListener("change", () => store.setItem(key, el.value));
}

/** Restores the saved settings and keeps saving them; `onKey` runs when the API key changes. */
export function initSettings(onKey) {
  for (const [id] of SAMPLERS) persist($(id), localStorage, `mlxcel.${id}`);
  persist($("system"), localStorage, "mlxcel.system");
  persist($("stop-strings"), localStorage, "mlxcel.stop");
  persist($("api-key"), sessionStorage, "mlxcel.apiKey");
  $("api-key").addEventListener("change", onKey);
  $("reset-settings").addEventListener("click", () => {
    for (const [id] of SAMPLERS) {
      $(id).value = id === "max-tokens" ? String(DEFAULT_MAX_TOKENS) : "";
      localStorage.removeItem(`mlxcel.${id}`);
    }
    $("stop-strings").value = "";
    localStorage.removeItem("mlxcel.stop");
  });
  applyTheme(localStorage.getItem("mlxcel.theme") || "system");
  $("theme").addEventListener("click", () => {
    const next = THEMES[(THEMES.indexOf(currentTheme()) + 1) % THEMES.length];
    localStorage.setItem("mlxcel.theme", next);
    applyTheme(next);
  });
}

function currentTheme() {
  return document.documentElement.dataset.theme || "system";
}

// `system` follows the browser's prefers-color-scheme (app.css); `light` and `dark` pin one.
function applyTheme(theme) {
  const root = document.documentElement;
  if (theme === "light" || theme === "dark") root.dataset.theme = theme;
  else delete root.dataset.theme;
  const button = $("theme");
  button.textContent = { system: "◐ Auto", light: "☀ Light", dark: "☾ Dark" }[currentTheme()];
  button.title = `colour theme: ${currentTheme()} (click to change)`;
}

/** The `Authorization` header for the key typed in the drawer, with JSON's content type. */
export function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

export function systemPrompt() {
  return $("system").value.trim();
}

/** The sampling fields of a chat request; a field that is not a number is refused naming it. */
export function requestParams() {
  const params = {};
  for (const [id, field, kind] of SAMPLERS) {
    const text = $(id).value.trim();
    if (!text) continue;
    const value = kind === "int" ? Number(text) : parseFloat(text);
    if (!Number.isFinite(value) || (kind === "int" && !Number.isInteger(value))) {
      throw new Error(`Settings: ${field} must be ${kind === "int" ? "a whole number" : "a number"}, not "${text}"`);
    }
    params[field] = value;
  }
  const stops = $("stop-strings")
    .value.split("\n")
    .filter((s) => s.length);
  if (stops.length) params.stop = stops;
  return params;
}
