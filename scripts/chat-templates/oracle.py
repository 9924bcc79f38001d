"""Renders the chat-template corpus with jinja2 the way Hugging Face transformers renders chat
templates, and compares the outputs with the expected files (or, with --bless, writes them).

    oracle.py CORPUS_DIR [--bless]

CORPUS_DIR holds corpus.json (cases, and which template renders which case), templates/*.jinja and
expected/<template>.<case>.txt (the output) or .error (`line N: message`, when rendering raises).
Exit status 1 on any difference, after printing a unified diff for each.

The environment below is written from transformers' documented behaviour (`apply_chat_template`),
not copied from it: an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loop-controls extension and a `{% generation %}` block; a `tojson` filter that is json.dumps with
ensure_ascii off (jinja's own escapes HTML characters); `raise_exception` and `strftime_now`
globals. The template is rendered
with messages, tools (None when absent), documents (None when absent), add_generation_prompt
(False when absent), the special tokens and every other keyword argument.
"""

import argparse
import difflib
import json
import sys
import traceback
from datetime import datetime
from pathlib import Path

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens with it
    (for return_assistant_tokens_mask) and otherwise renders the body as it is, as a call block."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment(now):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(format):
        # transformers formats datetime.now(); the corpus pins the clock instead.
        return now.strftime(format)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def template_line(error):
    """The template line an error was raised at: jinja2 rewrites tracebacks so that template
    frames carry the template's own line numbers, under the file name `<template>`."""
    line = getattr(error, "lineno", None)
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_filename == "<template>":
            line = lineno
    return line


def render(source, case, special_tokens, now):
    context = dict(case["context"])
    messages = context.pop("messages")
    tools = context.pop("tools", None)
    documents = context.pop("documents", None)
    add_generation_prompt = context.pop("add_generation_prompt", False)
    kwargs = {**special_tokens, **context}
    env = environment(datetime.fromisoformat(case.get("now", now)))
    try:
        template = env.from_string(source)
        text = template.render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except TemplateError as error:
        return "error", f"line {template_line(error)}: {error.message}\n"
    return "txt", text


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--bless", action="store_true", help="write the expected files")
    args = parser.parse_args()

    corpus = json.loads((args.corpus / "corpus.json").read_text(encoding="utf-8"))
    expected_dir = args.corpus / "expected"
    produced = set()
    failures = 0
    for template_name, case_names in corpus["renders"].items():
        # Bytes, not text: Python's universal newlines would hide what jinja2 does with \r\n.
        source = (args.corpus / "templates" / template_name).read_bytes().decode("utf-8")
        stem = template_name.removesuffix(".jinja")
        for case_name in case_names:
            kind, text = render(
                source, corpus["cases"][case_name], corpus["special_tokens"], corpus["now"]
            )
            path = expected_dir / f"{stem}.{case_name}.{kind}"
            produced.add(path.name)
            if args.bless:
                path.write_bytes(text.encode("utf-8"))
                continue
            expected = path.read_bytes().decode("utf-8") if path.is_file() else None
            if expected == text:
                continue
            failures += 1
            if expected is None:
                print(f"check-chat-templates: {path.name} is missing (jinja2 renders it)")
            diff = difflib.unified_diff(
                (expected or "").splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"expected/{path.name}",
                tofile="jinja2",
            )
            for line in diff:
                if not line.endswith("\n"):
                    line += "\n\\ No newline at end of file\n"
                sys.stdout.write(line)
    stale = sorted(p.name for p in expected_dir.iterdir() if p.name not in produced)
    for name in stale:
        if args.bless:
            (expected_dir / name).unlink()
        else:
            failures += 1
            print(f"check-chat-templates: expected/{name} matches no render in corpus.json")
    renders = len(produced)
    if failures:
        print(f"check-chat-templates: {failures} of {renders} renders differ from jinja2")
        return 1
    verb = "written by" if args.bless else "equal to"
    templates = len(corpus["renders"])
    print(f"check-chat-templates: {renders} renders of {templates} templates {verb} jinja2's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
