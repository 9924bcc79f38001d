#!/usr/bin/env python3
"""Generates the llama-server compatibility manifest from llama.cpp's source.

    compat/llama-server/generate.py LLAMA_CPP_DIR BUILD

reads LLAMA_CPP_DIR (llama.cpp's source tree: common/arg.cpp and tools/server/) and writes
compat/llama-server/BUILD/manifest.toml: every llama-server command-line option (its spellings,
its LLAMA_ARG_* variable, how many values it takes), every route, every request field of the
generation, embedding, tokenize and slots routes, every /props and /slots response field and
every metric family.

The inventory comes from the source; the curation (`state`, `to`, `note`, `test`) is kept from
the manifest already there, entry by entry. An entry new to the source is written with
`state = "unreviewed"`, which `cargo xtask check-compat` refuses until someone curates it; an
entry that left the source is dropped. Standard library only (Python 3.11: tomllib).
"""

import re
import sys
import tomllib
from pathlib import Path

CURATED = ("state", "to", "note", "test")


def strip_comments(text):
    """C++ text without // and /* */ comments and `#if 0` blocks, string and character literals
    left intact."""
    text = re.sub(r"^#if 0\n.*?^#endif\n", "", text, flags=re.M | re.S)
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing(text, start):
    """Index just past the bracket that closes the one at `start`, skipping string literals."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth, i = [], start
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c in pairs:
            depth.append(pairs[c])
        elif depth and c == depth[-1]:
            depth.pop()
            if not depth:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced bracket at {start}")


def split_top(text):
    """Splits a C++ argument list at its top-level commas."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while text[j] != c:
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i : j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if "".join(cur).strip():
        parts.append("".join(cur).strip())
    return parts


STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def function_body(text, signature):
    """The text of the function whose definition contains `signature` (to its closing brace)."""
    start = text.index(signature)
    brace = text.index("{", start)
    return text[brace : closing(text, brace)]


def options(src):
    """llama-server's options, in the order of --help."""
    text = strip_comments((src / "common/arg.cpp").read_text())
    defines = dict(re.findall(r'#define\s+(\w+)\s+"([^"]*)"', (src / "common/arg.h").read_text()))
    found, seen = [], set()
    for m in re.finditer(r"add_opt\(common_arg\(", text):
        call_open = m.end() - 1
        call_end = closing(text, call_open)
        args = split_top(text[call_open + 1 : call_end - 1])
        chain_end = closing(text, m.start() + len("add_opt"))
        chain = text[call_end : chain_end - 1]
        flags = STRING.findall(args[0])
        negated = STRING.findall(args[1]) if args[1].startswith("{") else []
        lam = next(a for a in args if a.startswith("["))
        params = split_top(lam[lam.index("(") + 1 : closing(lam, lam.index("(")) - 1])
        takes = 0 if "bool" in params[-1] and len(params) == 2 else len(params) - 1
        texts = [a for a in args[1 + bool(negated) :] if not a.startswith("[")]
        help_text = next((STRING.findall(t)[0] for t in reversed(texts) if STRING.findall(t)), "")
        examples = re.search(r"\.set_examples\(\{([^}]*)\}\)", chain)
        examples = examples.group(1) if examples else "LLAMA_EXAMPLE_COMMON"
        excludes = re.search(r"\.set_excludes\(\{([^}]*)\}\)", chain)
        in_server = "LLAMA_EXAMPLE_SERVER" in examples or "LLAMA_EXAMPLE_COMMON" in examples
        if not in_server or (excludes and "LLAMA_EXAMPLE_SERVER" in excludes.group(1)):
            continue
        if ".set_preset_only()" in chain:
            continue  # read from router presets only, never from a command line
        env = re.search(r'\.set_env\(\s*(?:"([^"]*)"|(\w+))\s*\)', chain)
        env = (env.group(1) or defines.get(env.group(2), env.group(2))) if env else None
        key = flags[0]
        if key in seen:
            continue  # -np is declared twice, once for the server's help section
        seen.add(key)
        entry = {"key": key, "flags": flags}
        if negated:
            entry["negated"] = negated
        entry["takes"] = takes
        if env:
            entry["env"] = env
        entry["help"] = help_text.split("\\n")[0][:120]
        found.append(entry)
    return found


def routes(src):
    text = strip_comments((src / "tools/server/server.cpp").read_text())
    found, seen = [], set()
    for method, path in re.findall(r'ctx_http\.(get|post|put|delete)\s*\(\s*"([^"]+)"', text):
        key = f"{method.upper()} {path}"
        if key not in seen:
            seen.add(key)
            found.append({"key": key})
    return found


def keys_read(body, names=("body", "data")):
    """The JSON keys a C++ function reads from its request objects, in order of appearance."""
    pattern = r'(?:json_value\(\s*(?:%s)\s*,\s*|(?:%s)\s*\.\s*(?:contains|at|find)\(\s*)"([^"]+)"' % (
        "|".join(names),
        "|".join(names),
    )
    return re.findall(pattern, body)


def unique(keys):
    seen, out = set(), []
    for k in keys:
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def fields(src):
    """Request fields per scope. `completion` (llama.cpp's task schema) applies to every
    generation route, since the OpenAI routes hand their body on to it; `chat`,
    `oai_completion` and `infill` are what those routes read before."""
    server = src / "tools/server"
    schema = strip_comments((server / "server-schema.cpp").read_text())
    cmpl_schema = function_body(schema, "make_llama_cmpl_schema(")
    completion = []
    for m in re.finditer(r'new field_\w+\("([^"]+)"', cmpl_schema):
        before = cmpl_schema[: m.start()]
        nested = re.search(r'new field_nested\("([^"]+)"\)\)\s*->add_subfield\(\($', before)
        completion.append(f"{nested.group(1)}.{m.group(1)}" if nested else m.group(1))
    completion += re.findall(r'add_alias\("([^"]+)"\)', cmpl_schema)
    completion += keys_read(schema)
    context = strip_comments((server / "server-context.cpp").read_text())
    completion += keys_read(function_body(context, "server_routes::handle_completions_impl("))
    common = strip_comments((server / "server-common.cpp").read_text())
    chat = keys_read(function_body(common, "json oaicompat_chat_params_parse("))
    oai_completion = keys_read(function_body(common, "json oaicompat_completion_params_parse("))
    oai_completion += re.findall(r'unsupported_params\s*\{([^}]*)\}', common)[0:1] and STRING.findall(
        re.findall(r'unsupported_params\s*\{([^}]*)\}', common)[0]
    )
    infill_text = context[context.index("this->post_infill") : context.index("this->post_completions")]
    infill = keys_read(infill_text, ("data",))
    infill += [f"input_extra.{k}" for k in keys_read(infill_text, ("chunk",))]
    embedding = keys_read(function_body(context, "server_routes::handle_embeddings_impl("))
    tokenize = keys_read(context[context.index("this->post_tokenize") : context.index("this->post_detokenize")])
    slots_text = context[context.index("this->get_slots") : context.index("this->get_props")]
    slots = [f"?{p}" for p in re.findall(r'get_param\("([^"]+)"\)', slots_text)]
    for handler in ("handle_slots_save(", "handle_slots_restore(", "handle_slots_erase("):
        body = function_body(context, f"server_routes::{handler}")
        slots += keys_read(body, ("request_data", "body", "data"))
    out = []
    for scope, keys in [
        ("completion", completion),
        ("oai_completion", oai_completion),
        ("infill", infill),
        ("chat", chat),
        ("embedding", embedding),
        ("tokenize", tokenize),
        ("slots", slots),
    ]:
        out += [{"key": f"{scope}:{k}"} for k in unique(keys)]
    return out


def responses(src):
    """Top-level fields of /props and of one /slots entry."""
    context = strip_comments((src / "tools/server/server-context.cpp").read_text())
    props = function_body(context, "static json get_res_props(")
    props_block = props[props.index("json props = {") :]
    props_keys = re.findall(r'^\s*\{\s*"([^"]+)",', props_block, re.M)
    props_keys = [k for k in props_keys if k not in ("vision", "video", "audio")]
    props_keys += re.findall(r'props\["([^"]+)"\]', props)
    slot = function_body(context, "json to_json(bool only_metrics = false) const")
    slot_keys = re.findall(r'\{\s*"([^"]+)",', slot) + re.findall(r'res\["([^"]+)"\]', slot)
    return [{"key": f"props:{k}"} for k in unique(props_keys)] + [
        {"key": f"slots:{k}"} for k in unique(slot_keys)
    ]


def metrics(src):
    task = strip_comments((src / "tools/server/server-task.cpp").read_text())
    body = function_body(task, "std::string server_task_result_metrics::to_metrics(")
    names = re.findall(r'\{\s*"([a-z_]+)",\s*"', body)
    names += re.findall(r'llamacpp:([a-z_]+)"', body)
    return [{"key": f"llamacpp:{n}"} for n in unique(names)]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


HEADER = """\
# llama-server compatibility manifest: what mlxcel-server does with each part of llama-server's
# interface at llama.cpp {build} (llama-cpp-python 0.3.36's vendor/llama.cpp).
#
# Generated by compat/llama-server/generate.py from llama.cpp's source, then curated: the
# generator keeps `state`, `to`, `note` and `test` of every entry it finds again, and writes new
# entries as "unreviewed". `cargo xtask check-compat` checks this file (docs/server.md).
#
# state: supported      mlxcel does what llama-server does
#        aliased        accepted, and does what `to` names
#        not_applicable accepted and answered as llama-server would, without effect here (`note`
#                       says why); a flag logs one warning line
#        deferred       refused with an error naming it until the work in `note` is done
#        by_design      refused or different on purpose (`note` says why)
#
# Keys: option = its first spelling; route = "METHOD /path"; field = "scope:name" where the
# completion scope is llama.cpp's task schema, read by every generation route, and `?name` is a
# query parameter; props/slots = a response field; metric = its family name.
"""


def render(build, sections, curated):
    lines = [HEADER.format(build=build), f'build = "{build}"', ""]
    for table, entries in sections:
        for e in entries:
            old = curated.get((table, e["key"]), {})
            lines.append(f"[[{table}]]")
            for k, v in e.items():
                lines.append(f"{k} = {toml_value(v)}")
            state = old.get("state", "unreviewed")
            lines.append(f"state = {toml_value(state)}")
            for k in CURATED[1:]:
                if k in old:
                    lines.append(f"{k} = {toml_value(old[k])}")
            lines.append("")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, build = Path(sys.argv[1]), sys.argv[2]
    out = Path(__file__).resolve().parent / build / "manifest.toml"
    curated = {}
    extra = ""
    if out.exists():
        old = tomllib.loads(out.read_text())
        for table in ("option", "route", "field", "response", "metric"):
            for e in old.get(table, []):
                curated[(table, e["key"])] = {k: e[k] for k in CURATED if k in e}
        # mlxcel's own flags are curated by hand; kept as they are.
        text = out.read_text()
        if "\n[mlxcel_only]" in text:
            # The section with the comment lines right above it.
            start = text.index("\n[mlxcel_only]")
            while text[text.rfind("\n", 0, start) + 1 : start].startswith("#"):
                start = text.rfind("\n", 0, start)
            extra = text[start:]
    sections = [
        ("option", options(src)),
        ("route", routes(src)),
        ("field", fields(src)),
        ("response", responses(src)),
        ("metric", metrics(src)),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(build, sections, curated).rstrip("\n") + "\n" + extra)
    counts = {t: len(e) for t, e in sections}
    print(f"{out}: {counts}")


if __name__ == "__main__":
    main()
