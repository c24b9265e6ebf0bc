#!/usr/bin/env python3
"""The precision study: memory and speed of one model at each precision.

For SmolLM2-135M (requantized from the shipped Q4_1 file with `hearth quantize`) and for
synthetic 1B- and 7B-shaped models (`hearth synth`), at F32, F16, Q8_0, Q5_K, Q4_K and
Q4_0, this measures: file size, predicted peak RSS (`hearth plan --json`), measured peak
RSS and its file-backed / anonymous parts, KV cache bytes, prefill and decode tok/s
(`hearth generate --json`: a prompt of exactly --prompt-tokens tokens, that many as the
batch so the whole scratch is written, --gen decoded tokens, greedy, --ignore-eos).
A row whose plan says "does not fit" is recorded as such and not run (7B F32 needs ~27 GB).

    bench/precision-study.py [--models smollm2,1b,7b] [--types f32,f16,q8_0,q5_k,q4_k,q4_0]
        [--threads 2] [--ctx 512] [--prompt-tokens 128] [--gen 32] [--dir models/study]
        [--keep] [--json OUT.json]

Prints a Markdown table (for docs/MEMORY.md). Generated files go to --dir (git-ignored
models/ by default) and are deleted right after their row (and on failure) unless --keep:
a 7B F16 is 13.5 GB, so at most one such file exists at a time (SmolLM2's F16, the source
of its other rows, stays until that model is done). Needs ../shared/reference/smollm2/
ppl_gpl3.txt (or $HEARTH_REFERENCE_DIR) for the prompt text.
Stdlib only. Needs `target/release/hearth` (built if missing; $HEARTH overrides) and the SmolLM2 file
(scripts/fetch-models.sh).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.environ.get("HEARTH_REFERENCE_DIR", os.path.join(ROOT, "..", "shared", "reference"))
MIB = 1 << 20


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    return r.stdout


def prompt_of(hearth, n_tokens):
    """The longest prefix of the GPL reference text with exactly n_tokens tokens (+BOS)."""
    path = os.path.join(REF, "smollm2", "ppl_gpl3.txt")
    if not os.path.isfile(path):
        sys.exit(f"{path} is missing: the prompt comes from the reference data (set HEARTH_REFERENCE_DIR)")
    text = open(path).read()
    lo, hi = 0, min(len(text), n_tokens * 12)
    count = lambda s: len(json.loads(run([hearth, "tokenize", "-m", SMOL, "--text", s, "--json"])))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(text[:mid]) <= n_tokens - 1 else (lo, mid - 1)
    return text[:lo]


def make(hearth, model, ty, path, threads):
    """Create the study file for (model, ty); returns seconds spent."""
    t0 = time.time()
    if model == "smollm2":
        if ty in ("f32", "f16"):
            # The shipped file is Q4_1 (+ Q8_0 head): --allow-requantize lets it be widened.
            cmd = [hearth, "quantize", "--allow-requantize", "--type", ty, SMOL, path]
        else:  # quantize from the F16 copy, as one would from the original weights
            f16 = path.replace(f"-{ty}.gguf", "-f16.gguf")
            if not os.path.exists(f16):
                run([hearth, "quantize", "--allow-requantize", "--type", "f16", SMOL, f16, "-t", str(threads)])
            cmd = [hearth, "quantize", "--type", ty, f16, path]
    else:
        # Q6_K output head for quantized types (llama-quantize's recipe), else the same type.
        out_ty = ty if ty in ("f32", "f16") else "q6_k"
        cmd = [hearth, "synth", "--shape", model, "--type", ty, "--output-type", out_ty, "--tokenizer-from", SMOL,
               "--out", path]
    run(cmd + ["-t", str(threads)])
    return time.time() - t0


def plan_of(hearth, model, ty, path, a):
    src = ["-m", path] if path else ["--shape", model, "--type", ty, "--output-type", ty if ty in ("f32", "f16") else "q6_k"]
    cmd = [hearth, "plan", *src, "-c", str(a.ctx), "-b", str(a.prompt_tokens), "-t", str(a.threads), "--json"]
    return json.loads(run(cmd))


def study_row(hearth, model, ty, path, prompt, a, made):
    """Plan, make, run and print one (model, type) row; returns it as a dict."""
    row = {"model": model, "type": ty, "threads": a.threads, "ctx": a.ctx, "prompt_tokens": a.prompt_tokens, "gen": a.gen}
    # Synthetic rows are planned from the shape first, so nothing too big is written.
    pre = None if model == "smollm2" else plan_of(hearth, model, ty, None, a)
    if pre is not None and not pre["fits"]:
        row.update(fits=False, predicted_peak_bytes=pre["peak_rss_bytes"], available_bytes=pre["available_bytes"],
                   file_bytes=pre["file_bytes"])
        print(f"| {model} | {ty} | {pre['file_bytes'] / MIB:.0f} | {pre['kv_cache_bytes'] / MIB:.1f} | "
              f"{pre['peak_rss_bytes'] / MIB:.0f} | does not fit ({pre['available_bytes'] / MIB:.0f} MiB "
              f"available): not run | – | – | – | – |", flush=True)
        return row
    if not os.path.exists(path):
        made.append(path)
        if model == "smollm2" and ty not in ("f32", "f16"):
            made.append(path.replace(f"-{ty}.gguf", "-f16.gguf"))
        row["make_s"] = make(hearth, model, ty, path, a.threads)
    p = plan_of(hearth, model, ty, path, a)
    g = json.loads(run([hearth, "generate", "-m", path, "-p", prompt, "-n", str(a.gen), "--ignore-eos",
                        "--temperature", "0", "-c", str(a.ctx), "-b", str(a.prompt_tokens), "-t", str(a.threads),
                        "--json"]))
    m, t = g["memory"], g["timings"]
    file_bytes = os.path.getsize(path)
    row.update(fits=True, file_bytes=file_bytes, predicted_peak_bytes=p["peak_rss_bytes"],
               measured_peak_bytes=m["peak_rss_bytes"], rss_file_bytes=m["rss_file_bytes"],
               rss_anon_bytes=m["rss_anon_bytes"], kv_cache_bytes=m["kv_cache_bytes"],
               prompt_len=len(g["prompt_tokens"]), prefill_tok_s=t["prefill_tok_s"],
               decode_tok_s=t["decode_tok_s"], memory=m, plan=p)
    meas = m["peak_rss_bytes"]
    print(f"| {model} | {ty} | {file_bytes / MIB:.1f} | {m['kv_cache_bytes'] / MIB:.1f} | "
          f"{p['peak_rss_bytes'] / MIB:.1f} | {meas / MIB:.1f} ({m['rss_file_bytes'] / MIB:.0f} + "
          f"{m['rss_anon_bytes'] / MIB:.0f}) | {p['peak_rss_bytes'] / meas:.3f} | "
          f"{meas / (file_bytes + m['kv_cache_bytes']):.3f} | {t['prefill_tok_s']:.1f} | "
          f"{t['decode_tok_s']:.2f} |", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="smollm2,1b,7b", help="smollm2 and/or synth shapes (tiny, 1b, 7b, 13b, 70b)")
    ap.add_argument("--types", default="f32,f16,q8_0,q5_k,q4_k,q4_0", help="weight types, one row each")
    ap.add_argument("--threads", type=int, default=2, help="threads for generate (and synth/quantize)")
    ap.add_argument("--ctx", type=int, default=512, help="context size (KV cache positions)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length, also the batch size")
    ap.add_argument("--gen", type=int, default=32, help="decoded tokens")
    ap.add_argument("--dir", default=os.path.join(ROOT, "models", "study"), help="where generated models go")
    ap.add_argument("--keep", action="store_true", help="keep generated models")
    ap.add_argument("--json", help="also write every row as JSON to this file")
    a = ap.parse_args()

    hearth = os.environ.get("HEARTH", os.path.join(ROOT, "target", "release", "hearth"))
    if not os.path.exists(hearth):
        run(["cargo", "build", "--release", "-q", "-p", "hearth"], cwd=ROOT)
    if not os.path.exists(SMOL):
        sys.exit("models/SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/fetch-models.sh")
    os.makedirs(a.dir, exist_ok=True)
    prompt = prompt_of(hearth, a.prompt_tokens)

    rows = []
    print("| model | type | file MiB | KV MiB | predicted peak MiB | measured peak MiB (file + anon) | pred/meas | "
          "peak / (file + KV) | pp tok/s | tg tok/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    made = []  # generated files not yet deleted

    def drop(paths):
        """Delete generated files (and a failed write's OUT.tmp-PID); never a file we did not make."""
        for f in [f for f in paths if f in made]:
            made.remove(f)
            tmps = [os.path.join(a.dir, n) for n in os.listdir(a.dir) if n.startswith(os.path.basename(f) + ".tmp-")]
            for g in [f, *tmps]:
                if os.path.exists(g):
                    os.remove(g)

    try:
        for model in a.models.split(","):
            for ty in a.types.split(","):
                path = os.path.join(a.dir, f"{model}-{ty}.gguf")
                rows.append(study_row(hearth, model, ty, path, prompt, a, made))
                if not a.keep and not (model == "smollm2" and ty == "f16"):
                    drop([path])  # SmolLM2's F16 is the source of its other rows
            if not a.keep:
                drop([os.path.join(a.dir, f"{model}-f16.gguf")])
    finally:
        if not a.keep:
            drop(list(made))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
