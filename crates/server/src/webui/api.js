// The page's calls to this server: the model list, and a streamed chat completion read as
// server-sent events.
import { headers } from "./settings.js";

/** The message of an error response: the API's `error.message`, else the status line. */
export async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error || body;
    return `${response.status}: ${error.message || JSON.stringify(body)}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

/** The ids `/v1/models` lists; throws with `status` 401 when the server wants a key. */
export async function models() {
  const response = await fetch("v1/models", { headers: headers() });
  if (!response.ok) {
    const err = new Error(await errorText(response));
    err.status = response.status;
    throw err;
  }
  const list = await response.json();
  return list.data.map((m) => m.id);
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

/** Streams `POST /v1/chat/completions` with `body`: `onDelta(delta)` gets each choice's delta
 * (`content`, `reasoning_content`), `onStats(timings, usage)` the final numbers. Aborting
 * `signal` closes the connection, which the server takes as a cancellation (it frees the slot). */
export async function streamChat(body, signal, onDelta, onStats) {
  const response = await fetch("v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw new Error(await errorText(response));
  let finish = null;
  await readEvents(response, (chunk) => {
    if (chunk.error) throw new Error(chunk.error.message);
    const choice = chunk.choices && chunk.choices[0];
    if (choice && choice.delta) onDelta(choice.delta);
    if (choice && choice.finish_reason) finish = choice.finish_reason;
    if (chunk.timings || chunk.usage) onStats(chunk.timings, chunk.usage);
  });
  return finish;
}
