"""The driver of scripts/check-answers: starts `mlxcel serve`, asks every question of factual.tsv
through /v1/chat/completions (temperature 0, at most 32 tokens), scores the replies."""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def questions(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            question, answers = line.split("\t")
            rows.append((question, answers.split("|")))
    return rows


def post(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def correct(reply, answers):
    return any(
        re.search(r"(?<![\w])" + re.escape(a) + r"(?![\w])", reply, re.IGNORECASE)
        for a in answers
    )


def main(argv):
    root, args = argv[0], argv[1:]
    binary = os.path.join(root, "target", "release", "mlxcel")
    model, verbose, serve_args = None, False, []
    while args:
        arg = args.pop(0)
        if arg == "--mlxcel":
            binary = args.pop(0)
        elif arg == "--model":
            model = args.pop(0)
        elif arg == "--verbose":
            verbose = True
        elif arg == "--":
            serve_args = args
            break
        else:
            sys.exit(f"check-answers: unknown argument {arg!r} (see the script's header)")
    port = free_port()
    command = [binary, "serve", "--host", "127.0.0.1", "--port", str(port)]
    if model:
        command += ["-m", model]
    server = subprocess.Popen(command + serve_args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if server.poll() is not None:
                sys.exit("check-answers: the server exited:\n" + server.stderr.read().decode())
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                sys.exit("check-answers: the server did not become healthy in 600 s")
            time.sleep(0.5)
        rows = questions(os.path.join(root, "scripts", "questions", "factual.tsv"))
        right, speeds = 0, []
        for question, answers in rows:
            reply = post(base + "/v1/chat/completions", {
                "messages": [{"role": "user", "content": question}],
                "temperature": 0,
                "max_tokens": 32,
            })
            text = reply["choices"][0]["message"]["content"] or ""
            ok = correct(text, answers)
            right += ok
            timings = reply.get("timings") or {}
            if timings.get("predicted_per_second"):
                speeds.append(timings["predicted_per_second"])
            if verbose:
                print(f"{'ok ' if ok else 'BAD'} {question} -> {text!r}")
        speed = f", decode {sum(speeds) / len(speeds):.1f} tok/s (server timings)" if speeds else ""
        print(f"{right}/{len(rows)} correct ({100 * right / len(rows):.1f}%){speed}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main(sys.argv[1:])
