#!/usr/bin/env python3
"""Refit the memory plan's runtime overhead: `OVERHEAD_BASE + OVERHEAD_PER_VOCAB · n_vocab`
(crates/memory/src/plan.rs; docs/MEMORY.md, "Overhead fit").

For SmolLM2 and tiny synthetic models carrying each reference tokenizer (`hearth synth
--shape tiny --tokenizer-from ggml-vocab-*.gguf`), runs `hearth generate -c 512 -b 8 -n 8
-t 2 --json` on a 271-token prompt (longer than the batch, so the whole scratch is written)
and takes the residual = measured peak RSS − the plan's other terms (resident file pages,
KV cache, scratch, from `hearth plan --json` with the same flags). Least squares of the
residuals over n_vocab gives the two constants. Prints a Markdown table and the fit.

    bench/overhead-fit.py [--runs 3] [--dir models/overhead-fit]

Each row's residual is the median of --runs runs. Needs `target/release/hearth` ($HEARTH
overrides), the SmolLM2 file (scripts/fetch-models.sh) and ../shared/reference/vocab
($HEARTH_VOCAB_DIR overrides). Stdlib only.
"""
import argparse
import json
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEARTH = os.environ.get("HEARTH", os.path.join(ROOT, "target/release/hearth"))
VOCAB = os.environ.get("HEARTH_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "reference", "vocab"))
SMOLLM2 = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
PROMPT = "the quick brown fox jumps over the lazy dog " * 30
FLAGS = ["-c", "512", "-b", "8", "-t", "2"]


def run_json(args):
    out = subprocess.run([HEARTH] + args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def residual(model, runs):
    plan = run_json(["plan", "-m", model, "--membw", "10", "--json"] + FLAGS)
    others = plan["file_resident_bytes"] + plan["kv_cache_bytes"] + plan["scratch_bytes"]
    peaks = []
    for _ in range(runs):
        g = run_json(["generate", "-m", model, "-p", PROMPT, "-n", "8", "--ignore-eos", "--temperature", "0", "--json"] + FLAGS)
        peaks.append(g["memory"]["peak_rss_bytes"])
    return plan["shape"]["n_vocab"], statistics.median(peaks) - others


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=os.path.join(ROOT, "models/overhead-fit"))
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    models = [("SmolLM2 Q4_1", SMOLLM2)]
    for v in ["SMOLLM2", "llama-spm", "gpt-2", "llama-bpe", "qwen2"]:
        src = SMOLLM2 if v == "SMOLLM2" else os.path.join(VOCAB, f"ggml-vocab-{v}.gguf")
        out = os.path.join(a.dir, f"tiny-{v.lower()}.gguf")
        if not os.path.exists(out):
            subprocess.run([HEARTH, "synth", "--shape", "tiny", "--type", "q4_0", "--tokenizer-from", src, "--out", out],
                           check=True, capture_output=True)
        models.append((f"tiny ({'SmolLM2' if v == 'SMOLLM2' else v} tokenizer)", out))
    rows = []
    for name, path in models:
        n_vocab, r = residual(path, a.runs)
        rows.append((name, n_vocab, r))
        print(f"{name}: n_vocab {n_vocab}, residual {r / 1e6:.2f} MB", flush=True)
    n = len(rows)
    xs, ys = [x for _, x, _ in rows], [y for _, _, y in rows]
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    base = my - slope * mx
    print()
    print("| model | n_vocab | residual MB | fit MB | error |")
    print("|---|---|---|---|---|")
    for name, x, y in rows:
        f = base + slope * x
        print(f"| {name} | {x} | {y / 1e6:.2f} | {f / 1e6:.2f} | {(f - y) / y * 100:+.0f}% |")
    print(f"\nfit: OVERHEAD_BASE = {base:,.0f} bytes, OVERHEAD_PER_VOCAB = {slope:.0f} bytes per token")


if __name__ == "__main__":
    main()
