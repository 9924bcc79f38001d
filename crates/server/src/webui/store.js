// Conversations saved in the browser (IndexedDB, one record per conversation), and their export
// and import as JSON. Nothing leaves the browser: the server keeps no history.

const DB = "mlxcel-chat";
const STORE = "conversations";
const FORMAT = "mlxcel-chat";
const ROLES = ["system", "user", "assistant"];

let opened = null;

function open() {
  if (!opened) {
    opened = new Promise((resolve, reject) => {
      const request = indexedDB.open(DB, 1);
      request.onupgradeneeded = () => {
        const store = request.result.createObjectStore(STORE, { keyPath: "id" });
        store.createIndex("updated", "updated");
      };
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error);
    });
  }
  return opened;
}

// One transaction on the store; resolves with the request's result once it commits.
async function run(mode, work) {
  const db = await open();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    const request = work(tx.objectStore(STORE));
    tx.oncomplete = () => resolve(request ? request.result : undefined);
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error);
  });
}

/** A new, empty conversation (not saved until it has a message). */
export function newConversation() {
  const now = Date.now();
  const id = crypto.randomUUID ? crypto.randomUUID() : `${now}-${Math.random().toString(36).slice(2)}`;
  return { id, title: "", created: now, updated: now, messages: [] };
}

/** Every saved conversation, the most recently updated first. */
export async function list() {
  const all = await run("readonly", (store) => store.getAll());
  return all.sort((a, b) => b.updated - a.updated);
}

export function get(id) {
  return run("readonly", (store) => store.get(id));
}

export function save(conversation) {
  return run("readwrite", (store) => store.put(conversation));
}

export function remove(id) {
  return run("readwrite", (store) => store.delete(id));
}

/** Every conversation as one JSON document: `{"format", "version", "conversations": [...]}`. */
export async function exportAll() {
  const conversations = await list();
  return JSON.stringify({ format: FORMAT, version: 1, exported: new Date().toISOString(), conversations }, null, 2);
}

/** Checks one conversation of an import, naming what is wrong; returns it with only the fields
 * the page keeps. */
function checked(value, where) {
  if (!value || typeof value !== "object") throw new Error(`${where}: not an object`);
  if (typeof value.id !== "string" || !value.id) throw new Error(`${where}.id: a non-empty string is required`);
  if (!Array.isArray(value.messages)) throw new Error(`${where}.messages: an array is required`);
  const messages = value.messages.map((m, k) => {
    const at = `${where}.messages[${k}]`;
    if (!m || !ROLES.includes(m.role)) throw new Error(`${at}.role: one of ${ROLES.join(", ")} is required`);
    if (typeof m.content !== "string") throw new Error(`${at}.content: a string is required`);
    const kept = { role: m.role, content: m.content };
    if (typeof m.reasoning === "string" && m.reasoning) kept.reasoning = m.reasoning;
    if (Array.isArray(m.attachments)) {
      kept.attachments = m.attachments.map((a, j) => {
        if (!a || typeof a.name !== "string" || typeof a.text !== "string") {
          throw new Error(`${at}.attachments[${j}]: {"name", "text"} strings are required`);
        }
        return { name: a.name, text: a.text };
      });
    }
    if (typeof m.stats === "string") kept.stats = m.stats;
    return kept;
  });
  const now = Date.now();
  return {
    id: value.id,
    title: typeof value.title === "string" ? value.title : "",
    created: Number.isFinite(value.created) ? value.created : now,
    updated: Number.isFinite(value.updated) ? value.updated : now,
    messages,
  };
}

/** Saves the conversations of an export (a conversation with a saved one's id replaces it);
 * nothing is saved when any of them is malformed. Returns how many were imported. */
export async function importAll(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`not JSON: ${err.message}`);
  }
  if (!doc || doc.format !== FORMAT || !Array.isArray(doc.conversations)) {
    throw new Error(`not an export of this page: {"format": "${FORMAT}", "conversations": [...]} is required`);
  }
  const conversations = doc.conversations.map((c, k) => checked(c, `conversations[${k}]`));
  await run("readwrite", (store) => {
    for (const c of conversations) store.put(c);
    return null;
  });
  return conversations.length;
}
