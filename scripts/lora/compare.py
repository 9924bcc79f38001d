"""Compares mlxcel's logits (family-logits JSON) with llama.cpp's (llama-lora JSON): the greedy
tokens must be the same and every logit within TOL of llama.cpp's, relative to its largest.

    compare.py LABEL OURS.json LLAMA.json TOL [BASE.json]

With BASE (the model without the adapter), also requires the adapter to have moved the logits
by much more than the tolerance, so that a check of an adapter that did nothing cannot pass.
"""
import json
import sys

label, ours_path, llama_path, tol = sys.argv[1:5]
tol = float(tol)
ours = json.load(open(ours_path))
llama = json.load(open(llama_path))
scale = max(abs(v) for row in llama["logits"] for v in row if v is not None)
worst = max(abs(a - b) for ra, rb in zip(ours["logits"], llama["logits"]) for a, b in zip(ra, rb)
            if a is not None and b is not None) / scale
ok = ours["tokens"] == llama["tokens"] and worst <= tol
moved = ""
if len(sys.argv) > 5:
    base = json.load(open(sys.argv[5]))
    shift = max(abs(a - b) for ra, rb in zip(base["logits"], llama["logits"])
                for a, b in zip(ra, rb) if a is not None and b is not None) / scale
    moved = f", adapter moved {shift:.2e}"
    ok = ok and shift > 100 * tol
print(f"check-lora: {label:<24} {'ok  ' if ok else 'FAIL'} max rel diff {worst:.2e}"
      f" (tol {tol:g}){moved}, tokens {'same' if ours['tokens'] == llama['tokens'] else 'DIFFER'}")
sys.exit(0 if ok else 1)
