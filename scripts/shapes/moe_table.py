"""The mixture-of-experts half of scripts/bench-shapes: gathers one shape's runs into a record of
results.jsonl, and writes the MoE table of docs/benchmarks.md from every MoE record.

    moe_table.py record RUN RESULTS KEY LABEL TYPE FILE COMMIT THREADS ROUNDS SECONDS CACHE_TYPE
    moe_table.py table RESULTS

RUN holds, per engine and round, `<engine>-<part>.<round>.{out,err,rss,cmd,failed}` as
scripts/bench-shapes' `run` writes them: the engines are llama.cpp (llama-bench), ik-fused
(ik_llama.cpp's llama-bench with `-fmoe 1 -rtr 1`), ik-plain (`-fmoe 0 -rtr 0`), and mlxcel's f32
and int8 activations; the parts pp (prompt) and tg (generation, with mlxcel's concurrent-streams
rows). A cell is the median of the rounds; a failed engine's cell says why (its last error line).
"""

import datetime
import json
import os
import re
import statistics
import sys

ENGINES = ("llama.cpp", "ik-fused", "ik-plain", "f32", "int8")
HEADINGS = {
    "llama.cpp": "llama.cpp tok/s",
    "ik-fused": "ik_llama.cpp -fmoe 1 -rtr 1 tok/s (×)",
    "ik-plain": "ik_llama.cpp -fmoe 0 -rtr 0 tok/s (×)",
    "f32": "mlxcel f32 tok/s (×)",
    "int8": "mlxcel int8 tok/s (×)",
}
BEGIN, END = "<!-- moe-shapes:begin -->\n", "<!-- moe-shapes:end -->"


def test_name(row):
    """One row's test, the same for llama-bench, ik_llama.cpp's llama-bench and mlxcel: pp512,
    tg128, tg128 @ d8192 (ik_llama.cpp's `-gp 8192,128`), tg128@8 (mlxcel's 8 streams)."""
    if row.get("test") and re.fullmatch(r"(pp|tg)\d+(@\d+)?( @ d\d+)?", row["test"]):
        return row["test"]
    n_prompt, n_gen, depth = row.get("n_prompt", 0), row.get("n_gen", 0), row.get("n_depth", 0)
    if n_prompt and n_gen:  # ik_llama.cpp's -gp: generation after a prompt of n_prompt
        return f"tg{n_gen} @ d{n_prompt}"
    base = f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"
    return base + (f" @ d{depth}" if depth else "")


def record(run, results, key, label, qtype, file, commit, threads, rounds, seconds, cache_type):
    def read(name):
        path = os.path.join(run, name)
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    bench = {e: {} for e in ENGINES}
    rss, commands, builds, params = {}, {}, {}, 0
    for engine in ENGINES:
        for part in ("pp", "tg"):
            for k in range(1, int(rounds) + 1):
                name = f"{engine}-{part}.{k}"
                commands.setdefault(f"{engine} {part}", read(name + ".cmd").strip())
                # The file's path says nothing the block's heading does not.
                failed = read(name + ".failed").strip().replace(file + ": ", "").replace(file, "FILE")
                if failed:
                    bench[engine].setdefault(part, {"error": failed})
                    continue
                try:
                    rows = json.loads(read(name + ".out") or "[]")
                except json.JSONDecodeError:
                    bench[engine].setdefault(part, {"error": "unreadable output"})
                    continue
                peak = int((read(name + ".rss") or "0").split()[0]) / 1024
                for r in rows:
                    t = test_name(r)
                    bench[engine].setdefault(t, []).append(r["avg_ts"])
                    params = params or r.get("model_n_params", 0)
                    if r.get("build_commit"):
                        builds[engine] = r["build_commit"]
                    cell = rss.setdefault(t, {})
                    cell[engine] = max(cell.get(engine, 0.0), peak)
    tests = sorted({t for cells in bench.values() for t in cells if t not in ("pp", "tg")},
                   key=lambda t: (t.startswith("tg"), "@" in t.split(" ")[0],
                                  int(t.split("d")[-1]) if " @ d" in t else 0))
    # A failed part stands for every test of that part the other engines ran, except the
    # concurrent-streams rows, which only mlxcel has.
    for engine, cells in bench.items():
        for part in ("pp", "tg"):
            if part in cells:
                err = cells.pop(part)
                for t in tests:
                    streams = "@" in t.split(" ")[0]
                    if t.startswith(part) and t not in cells and (engine in ("f32", "int8") or not streams):
                        cells[t] = err
    entry = {
        "key": key, "moe": True, "shape": label, "type": qtype, "commit": commit,
        "threads": int(threads), "rounds": int(rounds), "date": datetime.date.today().isoformat(),
        "seconds": int(seconds), "file_mib": os.path.getsize(file) / 2**20,
        "params_m": params / 1e6, "tests": tests, "bench": bench, "cache_type": cache_type,
        "peak_rss_mib": rss, "builds": builds, "commands": commands,
    }
    kept = [l for l in open(results)] if os.path.exists(results) else []
    kept = [l for l in kept if l.strip() and json.loads(l)["key"] != key]
    open(results, "w").writelines(kept + [json.dumps(entry) + "\n"])
    print(json.dumps(bench))


def block(r):
    def cell(engine, test):
        values = r["bench"][engine].get(test)
        if values is None:
            return None, "-"
        if isinstance(values, dict):
            error = values["error"]
            return None, (error if error.startswith("not run") else "failed: " + error)[:90]
        return statistics.median(values), None

    builds = r.get("builds", {})
    ik = builds.get("ik-fused") or builds.get("ik-plain") or "not run"
    lines = [
        f"**{r['shape']} {r['type']}** ({r['file_mib']:.0f} MiB file; {r['params_m']:.0f} M "
        f"parameters; mlxcel {r['commit']}, llama.cpp {builds.get('llama.cpp', '?')}, "
        f"ik_llama.cpp {ik}; {r['threads']} threads, rounds: {r['rounds']}, {r['date']}, "
        f"{r['seconds'] / 60:.0f} min; KV cache {r['cache_type']})",
        "",
        "| test | " + " | ".join(HEADINGS[e] for e in ENGINES)
        + " | peak RSS MiB: " + " / ".join(ENGINES) + " |",
        "|---|" + "---|" * (len(ENGINES) + 1),
    ]
    for test in r["tests"]:
        ref, _ = cell("llama.cpp", test)
        row = [test]
        for engine in ENGINES:
            v, err = cell(engine, test)
            if v is None:
                row.append(err)
            elif engine == "llama.cpp" or not ref:
                row.append(f"{v:.2f}")
            else:
                row.append(f"{v:.2f} ({v / ref:.2f}×)")
        peaks = r["peak_rss_mib"].get(test, {})
        row.append(" / ".join(f"{peaks[e]:.0f}" if e in peaks else "-" for e in ENGINES))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def table(results):
    records = [json.loads(l) for l in open(results) if l.strip()] if os.path.exists(results) else []
    records = sorted((r for r in records if r.get("moe")), key=lambda r: (r["shape"], r["type"]))
    path = "docs/benchmarks.md"
    doc = open(path).read()
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    blocks = {(r["shape"], r["type"]): block(r) for r in records}
    # A shape measured on another machine or cache (no record here) keeps its block as it stands.
    for old in ("\n" + doc[a:b]).split("\n**")[1:]:
        shape, qtype = old.split(" (", 1)[0].rstrip("*").split(" ")[:2]
        blocks.setdefault((shape, qtype), ("**" + old.rstrip("\n") + "\n").split("\n"))
    lines = [line for k in sorted(blocks) for line in blocks[k]]
    text = "\n".join(lines) if lines else "(no results yet: run scripts/bench-shapes olmoe-1b-7b)\n"
    open(path, "w").write(doc[:a] + text + doc[b:])
    print(text)


def main():
    if len(sys.argv) == 13 and sys.argv[1] == "record":
        record(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
