"""The DevTools-protocol driver of scripts/check-webui (which starts the server and Chromium and
passes PORT, KEY, PROFILE, WORK and SCREENSHOT). Each check names what failed.

Replies that must have a given shape (markdown with code and math, reasoning, markup meant to
inject HTML) come from the DevTools protocol's request interception (Fetch.fulfillRequest with a
canned event stream): the page's own streaming, rendering and saving run on them as on a server's.
Everything else (streaming, tok/s, max_tokens, regenerate, edit, stop) runs against the server on
the default model, greedy (temperature 0), so that the same question gets the same answer.
"""
import base64
import glob
import json
import os
import time
import urllib.request

from websockets.sync.client import connect

port, key = os.environ["PORT"], os.environ["KEY"]
origin = f"http://127.0.0.1:{port}"
work = os.environ["WORK"]
t0 = time.monotonic()


def log(msg):
    print(f"check-webui: {msg} ({time.monotonic() - t0:.1f} s)", flush=True)


def api(path):
    req = urllib.request.Request(origin + path, headers={"Authorization": f"Bearer {key}"})
    return urllib.request.urlopen(req, timeout=10).read().decode()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


# Chromium writes its DevTools port into the profile once it listens.
active = os.path.join(os.environ["PROFILE"], "DevToolsActivePort")
for _ in range(200):
    if os.path.exists(active) and open(active).read().strip():
        break
    time.sleep(0.1)
else:
    raise SystemExit("check-webui: Chromium did not start (no DevToolsActivePort)")
devtools = open(active).read().split()[0]
targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{devtools}/json/list", timeout=10))
page = next(t for t in targets if t["type"] == "page")
ws = connect(page["webSocketDebuggerUrl"], max_size=None)
next_id = 0
requests = []  # every request the page made: {"url", "method", "body"}
canned = []  # event streams to answer the next chat requests with, while interception is on


def on_event(msg):
    method = msg.get("method")
    if method == "Network.requestWillBeSent":
        r = msg["params"]["request"]
        requests.append({"url": r["url"], "method": r["method"], "body": r.get("postData")})
    elif method == "Fetch.requestPaused":
        params = msg["params"]
        if canned and params["request"]["url"].endswith("/v1/chat/completions"):
            body = canned.pop(0)
            send("Fetch.fulfillRequest", requestId=params["requestId"], responseCode=200,
                 responseHeaders=[{"name": "Content-Type", "value": "text/event-stream"}],
                 body=base64.b64encode(body.encode()).decode())
        else:
            send("Fetch.continueRequest", requestId=params["requestId"])


def send(method, **params):
    global next_id
    next_id += 1
    ws.send(json.dumps({"id": next_id, "method": method, "params": params}))
    return next_id


def cdp(method, **params):
    want = send(method, **params)
    while True:
        msg = json.loads(ws.recv())
        if "method" in msg:
            on_event(msg)
        if msg.get("id") == want:
            if "error" in msg:
                raise RuntimeError(f"{method}: {msg['error']}")
            return msg.get("result", {})


def js(expression):
    result = cdp("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
    if "exceptionDetails" in result:
        raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
    return result["result"].get("value")


def wait(expression, what, limit=120, every=0.05):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        value = js(expression)
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"check-webui: timed out waiting for {what}")


def chat_requests():
    return [json.loads(r["body"]) for r in requests
            if r["url"] == origin + "/v1/chat/completions" and r["method"] == "POST" and r["body"]]


def set_field(element_id, value):
    js(f"""(() => {{
  const el = document.getElementById({json.dumps(element_id)});
  el.value = {json.dumps(value)};
  el.dispatchEvent(new Event('change'));
}})()""")


def set_files(selector, paths):
    root = cdp("DOM.getDocument")["root"]["nodeId"]
    node = cdp("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
    cdp("DOM.setFileInputFiles", nodeId=node, files=paths)


def turns():
    """How many turns the page has finished (its body's data-turns)."""
    return int(js("Number(document.body.dataset.turns || 0)"))


expected_turns = 0


def type_and_send(text):
    global expected_turns
    expected_turns = turns() + 1
    js("document.getElementById('input').focus()")
    cdp("Input.insertText", text=text)
    js("document.getElementById('send').click()")


def last_answer():
    return "[...document.querySelectorAll('.message.assistant')].pop()"


def wait_answer(what, limit=120):
    """Waits for the turn started last (type_and_send, or expect_turn before a click) to end."""
    wait(f"Number(document.body.dataset.turns || 0) >= {expected_turns}", what, limit=limit, every=0.02)
    return js(f"{last_answer()}.querySelector('.text').textContent")


def expect_turn():
    global expected_turns
    expected_turns = turns() + 1


def click_in_last(selector):
    js(f"{last_answer()}.querySelector({json.dumps(selector)}).click()")


def list_titles():
    return js("[...document.querySelectorAll('#conversation-list .open')].map(b => b.textContent)")


def sse(content_pieces, reasoning_pieces=()):
    """A chat stream as the server sends it: reasoning deltas, content deltas, the usage chunk."""
    def chunk(delta, finish=None):
        return "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"
    out = chunk({"role": "assistant"})
    out += "".join(chunk({"reasoning_content": p}) for p in reasoning_pieces)
    out += "".join(chunk({"content": p}) for p in content_pieces)
    out += chunk({}, "stop")
    out += "data: " + json.dumps({"object": "chat.completion.chunk", "choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": len(content_pieces), "total_tokens": 10 + len(content_pieces)}}) + "\n\n"
    return out + "data: [DONE]\n\n"


cdp("Network.enable")
cdp("Page.enable")
cdp("DOM.enable")
cdp("Page.setDownloadBehavior", behavior="allow", downloadPath=work)
cdp("Page.navigate", url=origin + "/")
wait("document.readyState === 'complete' && document.body.dataset.ready === 'true'", "the page")
log("page loaded without a key")
wait("document.getElementById('status').textContent.includes('API key')", "the request for a key")

# The key, typed into the settings, reaches the API as a Bearer token.
set_field("api-key", key)
set_field("temperature", "0")
served = json.loads(api("/v1/models"))["data"][0]["id"]
model = wait(f"document.getElementById('model').textContent === {json.dumps(served)} && document.getElementById('model').textContent", "the model name")
log(f"model shown: {model}")

# A streamed answer: the text grows while the message is streaming. The page records every
# length the answer's text takes before it is done (a mutation observer sees each update, however
# fast the tokens come; polling from here can miss all but one). The answer is asked to be a few
# sentences: a one-sentence answer (8 tokens, ~35 ms at int8 speed) could reach the page in one
# network read, rendered once.
js(f"""(() => {{
  window.__lengths = [];
  new MutationObserver(() => {{
    const b = {last_answer()};
    if (!b || b.dataset.done === 'true') return;
    const n = b.querySelector('.text').textContent.length;
    if (n && window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
  }}).observe(document.getElementById('messages'), {{subtree: true, childList: true, characterData: true, attributes: true}});
}})()""")
type_and_send("Name three cities in France and say one thing about each.")
wait(f"(() => {{ const b = {last_answer()}; return b && b.dataset.done === 'true'; }})()", "the answer", limit=120, every=0.02)
seen = set(js("window.__lengths"))
answer = js(f"{last_answer()}.querySelector('.text').textContent")
stats = js(f"{last_answer()}.querySelector('.stats') && {last_answer()}.querySelector('.stats').textContent")
tps = float(js(f"{last_answer()}.dataset.tokensPerSecond || '0'"))
error = js(f"{last_answer()}.classList.contains('error')")
assert answer and not error, f"no answer: {answer!r}"
assert len(seen) >= 2, f"the answer did not arrive in pieces (partial lengths seen: {sorted(seen)})"
assert stats and "tok/s" in stats and tps > 0, f"no tok/s: {stats!r}"
log(f"streamed answer ({len(seen)} partial states seen): {answer!r}; {stats}")

# The request carries the default token budget and the settings' temperature.
first = chat_requests()[-1]
assert first.get("max_tokens") == 1024 and first.get("temperature") == 0, f"the request's settings: {first}"
assert first["messages"][-1]["content"].startswith("Name three cities"), first
log("the request carried max_tokens 1024 (the default) and temperature 0")

# Markup in a message is text: no element is created and no script runs.
type_and_send('<img src=x onerror="window.__xss = 1"><b>bold?</b> Reply with OK.')
wait_answer("the second answer")
assert js("document.querySelectorAll('#messages img, #messages b').length") == 0, "markup became HTML"
assert js("window.__xss === undefined"), "a handler in a message ran"
assert "<img src=x" in js("[...document.querySelectorAll('.message.user')].pop().textContent")
log("markup in messages stays text")

# max_tokens from the settings bounds the answer: 5 tokens, finish_reason "length".
set_field("max-tokens", "5")
type_and_send("Count from one to one hundred in words.")
wait_answer("the answer bounded by max_tokens")
sent = chat_requests()[-1]
stats = js(f"{last_answer()}.querySelector('.stats').textContent")
assert sent.get("max_tokens") == 5, f"max_tokens not sent: {sent}"
assert stats.startswith("5 tokens"), f"the answer was not bounded to 5 tokens: {stats!r}"
assert "max tokens" in js("document.getElementById('status').textContent")
set_field("max-tokens", "1024")
log(f"max_tokens 5 sent and honoured ({stats})")

# A canned reply with markdown, code, math, reasoning and injection attempts, in a new chat.
js("document.getElementById('clear').click()")
wait("document.querySelectorAll('#messages .message').length === 0", "a new chat")
reply = [
    "Here is a function and a formula.\n\n",
    "```python\ndef square(x):\n    # the square\n    return x ** 2  # e.g. 4\n```\n\n",
    "Inline math: $E = mc^2$, and the area under $x^2$:\n\n",
    "$$\n\\int_0^1 x^2 \\, dx = \\frac{1}{3}\n$$\n\n",
    "- **bold** and `code`\n- a [link](https://example.com)\n\n",
    "<img src=x onerror=\"window.__xss2 = 1\"><script>window.__xss3 = 1</script> ",
    "[click](javascript:window.__xss4=1)",
]
canned.append(sse(reply, ["The user wants ", "a demonstration."]))
cdp("Fetch.enable", patterns=[{"urlPattern": "*/v1/chat/completions", "requestStage": "Request"}])
type_and_send("Show me a Python function and a formula.")
wait_answer("the canned markdown reply")
cdp("Fetch.disable")
box = last_answer()
code = js(f"(() => {{ const c = {box}.querySelector('.text pre > code.language-python'); return c && {{kw: [...c.querySelectorAll('.tok-keyword')].map(s => s.textContent), com: [...c.querySelectorAll('.tok-comment')].map(s => s.textContent), num: [...c.querySelectorAll('.tok-number')].map(s => s.textContent), text: c.textContent}}; }})()")
assert code and "def" in code["kw"] and "return" in code["kw"], f"no highlighted python block: {code}"
assert code["com"] == ["# the square", "# e.g. 4"] and "2" in code["num"], f"highlighting: {code}"
assert code["text"] == "def square(x):\n    # the square\n    return x ** 2  # e.g. 4", code["text"]
math = js(f"""(() => {{
  const inline = {box}.querySelector('.text p .math-inline math:not([display])');
  const display = {box}.querySelector('.text .math-display math[display="block"]');
  return {{inline: inline && inline.querySelector('msup') !== null, display: display && !!display.querySelector('mfrac') && !!display.querySelector('msubsup, munderover'),
           width: display ? display.getBoundingClientRect().width : 0}};
}})()""")
assert math["inline"] and math["display"] and math["width"] > 20, f"math did not render as MathML: {math}"
assert js(f"{box}.querySelectorAll('img, script, b').length") == 0, "markup in a reply became HTML"
assert js("window.__xss2 === undefined && window.__xss3 === undefined && window.__xss4 === undefined"), "a reply ran script"
text = js(f"{box}.querySelector('.text').textContent")
assert '<img src=x onerror="window.__xss2 = 1">' in text and "<script>" in text, f"the markup is not shown as text: {text!r}"
assert js(f"[...{box}.querySelectorAll('a')].map(a => a.href).join(' ')") == "https://example.com/", "links: only the https one"
reasoning = js(f"(() => {{ const r = {box}.querySelector('.reasoning'); return {{hidden: r.hidden, open: r.open, text: r.querySelector('.reasoning-text').textContent}}; }})()")
assert reasoning == {"hidden": False, "open": False, "text": "The user wants a demonstration."}, f"reasoning: {reasoning}"
assert "demonstration" not in text, "the reasoning is mixed into the answer"
log("markdown: highlighted python block, inline and display MathML, reasoning collapsed apart, injected markup shown as text")

# The renderer on hostile input: only the elements and attributes it makes itself, links only to
# http(s) and mailto, whatever the text holds.
hostile = [
    '<svg onload="window.__xss5 = 1"><iframe src="javascript:window.__xss5 = 1"></iframe>',
    '[a](JaVaScRiPt:window.__xss5=1) [b]( javascript:window.__xss5=1) [c](data:text/html,<script>1</script>) [d](vbscript:x)',
    '<a href="javascript:window.__xss5=1">e</a> ![f](javascript:window.__xss5=1)',
    '```html\n</code></pre><script>window.__xss5 = 1</script>\n```',
    '`<img src=x onerror=window.__xss5=1>` **<b>x</b>** _<i>y</i>_ ~~<u>z</u>~~',
    '$\\href{javascript:window.__xss5=1}{x}$ $\\text{<img src=x onerror=window.__xss5=1>}$ $$\\unknown{x}$$',
    '| <img src=x> | b |\n|---|---|\n| <script>window.__xss5=1</script> | [g](javascript:1) |',
    '> <style>body{display:none}</style>\n\n1. <form action=x><input></form>',
]
report = js(f"""import('/webui/markdown.js').then(({{renderMarkdown}}) => {{
  const allowed = new Set(['DIV','P','H1','H2','H3','H4','H5','H6','PRE','CODE','SPAN','BUTTON','UL','OL','LI','BLOCKQUOTE','HR','BR','TABLE','THEAD','TBODY','TR','TH','TD','STRONG','EM','DEL','A',
    'math','semantics','annotation','mrow','mi','mn','mo','mtext','msup','msub','msubsup','munder','mover','munderover','mfrac','msqrt','mroot','mspace','mtable','mtr','mtd','merror']);
  const attrs = new Set(['class','href','rel','target','start','type','data-copy','display','encoding','mathvariant','stretchy','fence','largeop','movablelimits','data-limits','width','linebreak','data-row-break','accent','linethickness','columnalign']);
  const bad = [];
  for (const text of {json.dumps(hostile)}) {{
    const root = renderMarkdown(text);
    for (const el of root.querySelectorAll('*')) {{
      if (!allowed.has(el.tagName)) bad.push(`<${{el.tagName}}> from ${{text}}`);
      for (const a of el.attributes) {{
        if (!attrs.has(a.name)) bad.push(`${{el.tagName}}[${{a.name}}] from ${{text}}`);
        if (a.name === 'href' && !/^(https?:|mailto:)/.test(a.value)) bad.push(`href=${{a.value}} from ${{text}}`);
      }}
    }}
  }}
  return {{bad, xss: window.__xss5 === undefined}};
}})""")
assert report["xss"] and not report["bad"], f"the renderer made what it should not: {report}"
log(f"{len(hostile)} hostile markdown texts rendered with only the renderer's own elements and safe links")

shot = os.environ["SCREENSHOT"]
cdp("Emulation.setDeviceMetricsOverride", width=1000, height=900, deviceScaleFactor=1, mobile=False)
js("window.scrollTo(0, 0)")
data = cdp("Page.captureScreenshot", format="png")["data"]
cdp("Emulation.clearDeviceMetricsOverride")
with open(shot, "wb") as f:
    f.write(base64.b64decode(data))
log(f"screenshot: {shot} ({os.path.getsize(shot)} bytes)")

# Regenerate and edit, greedy: the same question gets the same answer again.
js("document.getElementById('clear').click()")
wait("document.querySelectorAll('#messages .message').length === 0", "a new chat")
type_and_send("What is the capital of France?")
first_answer = wait_answer("the answer to regenerate")
n_requests = len(chat_requests())
expect_turn()
click_in_last(".action-regenerate")
again = wait_answer("the regenerated answer")
assert len(chat_requests()) == n_requests + 1, "regenerate sent no request"
assert js("document.querySelectorAll('#messages .message').length") == 2, "regenerate added a turn instead of replacing it"
assert again == first_answer, f"greedy regenerate gave another answer: {first_answer!r} then {again!r}"
assert chat_requests()[-1]["messages"][-1]["content"] == "What is the capital of France?"
log(f"regenerate replaced the answer (greedy, the same text: {again[:60]!r})")

expect_turn()
js("document.querySelector('.message.user .action-edit').click()")
js("""(() => {
  const area = document.querySelector('.message.user .editor textarea');
  area.value = 'What is the capital of Italy?';
  document.querySelector('.message.user .edit-save').click();
})()""")
edited = wait_answer("the answer to the edited question")
last = chat_requests()[-1]["messages"]
assert last[-1] == {"role": "user", "content": "What is the capital of Italy?"} and len([m for m in last if m["role"] == "user"]) == 1, last
assert js("document.querySelector('.message.user .text').textContent") == "What is the capital of Italy?"
assert js("document.querySelectorAll('#messages .message').length") == 2
log(f"edit asked again with the new text: {edited[:60]!r}")

# A reload keeps the conversations and reopens the last one.
titles = list_titles()
assert len(titles) == 3, f"three conversations were saved: {titles}"
cdp("Page.reload")
wait("document.readyState === 'complete' && document.body.dataset.ready === 'true'", "the reloaded page")
assert js("document.querySelector('.message.user .text').textContent") == "What is the capital of Italy?"
assert js(f"{last_answer()}.querySelector('.text').textContent") == edited
assert list_titles() == titles, f"the list changed across the reload: {titles} then {list_titles()}"
log(f"a reload kept {len(titles)} conversations and reopened the last")

# Rename, export, delete, import.
js("document.querySelector('#conversation-list li.current .rename').click()")
js("""(() => {
  const f = document.querySelector('#conversation-list .rename-field');
  f.value = 'Capitals';
  f.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
})()""")
wait("document.querySelector('#conversation-list li.current .open') && document.querySelector('#conversation-list li.current .open').textContent === 'Capitals'", "the renamed title")
js("document.getElementById('export').click()")
end = time.monotonic() + 20
while not glob.glob(os.path.join(work, "mlxcel-chats-*.json")) and time.monotonic() < end:
    time.sleep(0.1)
exported_path = (glob.glob(os.path.join(work, "mlxcel-chats-*.json")) or [None])[0]
assert exported_path, "no export was downloaded"
time.sleep(0.3)
exported = json.load(open(exported_path))
assert exported["format"] == "mlxcel-chat" and len(exported["conversations"]) == 3, exported
assert exported["conversations"][0]["title"] == "Capitals"
assert exported["conversations"][0]["messages"][0]["content"] == "What is the capital of Italy?"
js("document.querySelector('#conversation-list li.current .delete').click()")
js("document.querySelector('#conversation-list li.current .delete').click()")
wait("document.querySelectorAll('#conversation-list li').length === 2", "the deletion")
assert "Capitals" not in list_titles() and js("document.querySelectorAll('#messages .message').length") == 0
bad = os.path.join(work, "bad.json")
with open(bad, "w") as f:
    json.dump({"format": "mlxcel-chat", "conversations": [{"id": "x", "messages": [{"role": "wizard", "content": "hi"}]}]}, f)
set_files("#import-file", [bad])
wait("document.getElementById('status').textContent.includes('conversations[0].messages[0].role')", "the refused import")
assert len(list_titles()) == 2, "a refused import saved something"
set_files("#import-file", [exported_path])
wait("document.querySelectorAll('#conversation-list li').length === 3", "the import")
assert sorted(list_titles()) == sorted(t if t != titles[0] else "Capitals" for t in titles), list_titles()
js("[...document.querySelectorAll('#conversation-list .open')].find(b => b.textContent === 'Capitals').click()")
wait("document.querySelector('.message.user') && document.querySelector('.message.user .text').textContent === 'What is the capital of Italy?'", "the imported conversation")
log("rename, export (3 conversations as JSON), delete, a refused import naming the field, import")

# Attachments: a text file's content goes into the user turn; a binary file is refused.
notes = os.path.join(work, "notes.txt")
with open(notes, "w") as f:
    f.write("The secret word is pineapple.\n")
binary = os.path.join(work, "blob.bin")
with open(binary, "wb") as f:
    f.write(b"\x00\x01\x02\xff")
set_files("#attach", [binary])
wait("document.getElementById('status').textContent.includes('blob.bin: not a text file')", "the refused binary file")
set_files("#attach", [notes])
wait("document.querySelectorAll('#pending-attachments .attachment').length === 1", "the attachment")
set_field("max-tokens", "16")
type_and_send("What is the secret word in the file?")
wait_answer("the answer about the file")
content = chat_requests()[-1]["messages"][-1]["content"]
assert content.startswith("What is the secret word in the file?") and "notes.txt:" in content and "The secret word is pineapple." in content, content
assert "notes.txt" in js("[...document.querySelectorAll('.message.user')].pop().querySelector('.attachments').textContent")
set_field("max-tokens", "1024")
log("a text file attached went into the turn; a binary one was refused")

# Dark mode: the system's preference, and the toggle (kept across a reload).
def background():
    return js("getComputedStyle(document.body).backgroundColor")
light, dark = "rgb(250, 250, 250)", "rgb(23, 23, 26)"
cdp("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "light"}])
assert js("document.documentElement.dataset.theme === undefined") and background() == light, background()
cdp("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "dark"}])
assert background() == dark, f"the system's dark preference is not followed: {background()}"
js("document.getElementById('theme').click()")  # system -> light
assert js("document.documentElement.dataset.theme") == "light" and background() == light, background()
js("document.getElementById('theme').click()")  # light -> dark
cdp("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "light"}])
assert js("document.documentElement.dataset.theme") == "dark" and background() == dark, background()
cdp("Page.reload")
wait("document.readyState === 'complete' && document.body.dataset.ready === 'true'", "the reloaded page")
assert background() == dark, "the dark theme was not kept across a reload"
js("document.getElementById('theme').click()")  # dark -> system (light)
assert background() == light
log("dark mode: follows the system, the toggle pins light or dark and survives a reload")

# Stop: a long answer is aborted; the server cancels the request and frees its slot.
before = metric(api("/metrics"), 'mlxcel_http_requests_finished_total{reason="cancelled"}')
type_and_send("Write a long story about a dragon, at least 1000 words.")
wait(f"(() => {{ const b = {last_answer()}; return b && b.dataset.done !== 'true' && b.querySelector('.text').textContent.length > 20; }})()", "the long answer to start")
assert js("!document.getElementById('stop').disabled"), "the stop button is disabled while streaming"
js("document.getElementById('stop').click()")
wait(f"{last_answer()}.dataset.done === 'true'", "the stopped answer")
stopped_text = js(f"{last_answer()}.querySelector('.text').textContent")
assert js(f"{last_answer()}.dataset.stopped === 'true'"), f"the answer ended before the stop button was pressed: {stopped_text!r}"
assert js("document.getElementById('status').textContent") == "stopped"
end = time.monotonic() + 30
while time.monotonic() < end:
    cancelled = metric(api("/metrics"), 'mlxcel_http_requests_finished_total{reason="cancelled"}')
    busy = [s for s in json.loads(api("/slots")) if s["is_processing"]]
    if cancelled > before and not busy:
        break
    time.sleep(0.1)
else:
    raise SystemExit(f"check-webui: the server did not cancel the stopped request (cancelled {before} -> {cancelled}, busy slots {busy})")
log(f"stop aborted the stream; the server counted it cancelled ({before:.0f} -> {cancelled:.0f}) and freed the slot")

# Every request stayed on the server's origin (the export's blob: URL is the page's own).
foreign = [r["url"] for r in requests if not r["url"].startswith((origin, f"blob:{origin}/"))]
assert not foreign, f"requests outside the server's origin: {foreign}"
log(f"{len(requests)} requests, all to {origin}")
ws.close()
