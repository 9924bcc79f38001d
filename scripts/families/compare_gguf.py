"""The comparison of scripts/check-families-gguf (standard library only).

    compare_gguf.py DIR BACKEND TOLERANCE GELU_TOLERANCE

DIR is a variant of scripts/check-families (its oracle.json from mlx-lm) after the GGUF steps:
export.txt (what export-gguf printed: `lossy FIELD: why` lines, then the round trip's `roundtrip`
lines), llama.json (llama.cpp's logits and greedy tokens on the GGUF, from llama_greedy.cpp) and
ours-gguf-BACKEND.json (mlxcel's on the GGUF converted by our importer, from family-logits). A
BACKEND of `-` reports an import that export-gguf's round trip says was refused.

Passes when mlxcel picks llama.cpp's tokens with every logit within TOLERANCE x the largest
llama.cpp logit, and the round trip (export, then import) changed nothing it should not have.
Models with a GELU MLP (Gemma) get GELU_TOLERANCE instead: llama.cpp's CPU GELU rounds its input
to f16 and reads an f16 table (GGML_GELU_FP16 in ggml-cpu/vec.h), some 1e-3 of each activation.
Where the GGUF carries every feature of the checkpoint (no `lossy` line), llama.cpp must also agree
with mlx-lm on the original checkpoint, under the same rule: that checks the export itself, which a
mistake shared by llama.cpp and our importer would otherwise hide. Prints one line; exits 1 on a
failure.
"""

import json
import math
import os
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def difference(reference, other):
    """(max |other - reference|, max |reference|, problems) over the logit vectors."""
    problems = []
    if len(reference["logits"]) != len(other["logits"]):
        problems.append(f"{len(other['logits'])} logit vectors, expected {len(reference['logits'])}")
    max_diff, max_logit = 0.0, 0.0
    for step, (a, b) in enumerate(zip(reference["logits"], other["logits"])):
        if len(a) != len(b):
            problems.append(f"step {step}: {len(b)} logits, expected {len(a)}")
            continue
        max_logit = max(max_logit, max(abs(x) for x in a if x is not None))
        for x, y in zip(a, b):
            diff = abs(x - y) if x is not None and y is not None else math.inf
            max_diff = max(max_diff, diff if diff == diff else math.inf)
    return max_diff, max_logit, problems


def tokens_agree(reference, other):
    """(number of equal greedy tokens, first differing step or None)."""
    a, b = reference["tokens"], other["tokens"]
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return same, first


def oracle_comparison(oracle, llama, lossy, tolerance):
    """(text, problems): llama.cpp on the GGUF against mlx-lm on the checkpoint, where the GGUF
    carries the whole checkpoint."""
    if lossy:
        return "mlx-lm not comparable (lossy: " + ", ".join(dict.fromkeys(lossy)) + ")", []
    diff, largest, problems = difference(oracle, llama)
    relative = diff / largest if largest else math.inf
    same, first = tokens_agree(oracle, llama)
    problems = [f"llama.cpp vs mlx-lm: {p}" for p in problems]
    if first is not None or relative > tolerance:
        problems.append(f"llama.cpp differs from mlx-lm on a lossless export (tokens "
                        f"{llama['tokens']} vs {oracle['tokens']}, relative {relative:.1e}): "
                        "the export is wrong")
    return f"llama.cpp vs mlx-lm: tokens {same}/{len(oracle['tokens'])}, " \
           f"relative {relative:.1e}", problems


def main(directory, backend, tolerance, gelu_tolerance):
    oracle = load(os.path.join(directory, "oracle.json"))
    llama = load(os.path.join(directory, "llama.json"))
    with open(os.path.join(directory, "export.txt")) as f:
        export = [line.rstrip("\n") for line in f]
    lossy = [line.split(" ", 1)[1].split(":", 1)[0] for line in export if line.startswith("lossy ")]
    problems = [line[len("roundtrip FAIL "):] for line in export
                if line.startswith("roundtrip FAIL")]
    name = oracle["variant"]
    config_path = os.path.join(directory, "imported", "config.json")
    config = load(config_path) if os.path.exists(config_path) else {}
    activation = config.get("hidden_activation") or config.get("hidden_act") or ""
    if "gelu" in activation:
        tolerance = gelu_tolerance
    oracle_text, oracle_problems = oracle_comparison(oracle, llama, lossy, tolerance)

    if backend == "-":
        print(f"check-families-gguf: {name:<12} FAIL: our " + "; ".join(problems)
              + f"; {oracle_text}")
        return False
    ours = load(os.path.join(directory, f"ours-gguf-{backend}.json"))
    max_diff, max_logit, shape = difference(llama, ours)
    problems += shape + oracle_problems
    relative = max_diff / max_logit if max_logit else math.inf
    if relative > tolerance:
        problems.append(f"relative diff {relative:.1e} > {tolerance:g}")
    same, first = tokens_agree(llama, ours)
    if first is not None:
        problems.append(f"greedy tokens differ from step {first}: ours {ours['tokens']}, "
                        f"llama.cpp {llama['tokens']}")
    verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    print(f"check-families-gguf: {name:<12} {backend:<3} tokens {same}/{len(llama['tokens'])} "
          f"same as llama.cpp, max|diff| {max_diff:.1e} (relative {relative:.1e}); "
          f"{oracle_text}  {verdict}")
    return not problems


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    sys.exit(0 if main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])) else 1)
