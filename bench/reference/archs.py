#!/usr/bin/env python3
"""Reference data from llama.cpp for tiny random-weight GGUF files of each architecture variant hearth supports.

Everything this script writes is llama.cpp's output (data, not hearth's), plus the recipe of each file:
  crates/model/tests/data/archs.json   keyed by variant name: the synth argument list, the file's sha256 and
                                       size, prompt ids, top-100 last-position logits, greedy generations with
                                       the top-2 logits of every step, perplexity at -c 128

The GGUF files are NOT in the repository: they are written to /tmp/hearth-archs/ by hearth's own `synth`
command and are reproducible from the argument lists stored in the JSON (the same flags and seed give a
byte-identical file; this script writes every file twice and checks the two sha256 agree, and the JSON
records each file's sha256 and size so a test can check that it regenerated the same file).

How it was run (from the repository root):

  source /tmp/llamacpp/ENV.sh
  /tmp/llamacpp/venv/bin/python bench/reference/archs.py [--synth /tmp/hearth-synth] [--only NAME,...]

The qwen2moe entry was added later (branch shexp, issue #21) without ENV.sh, with the bindings' source and
the same native build named explicitly (numpy pip-installed into that venv; llama-perplexity and
llama-tokenize built in that build tree with `ninja -j 1 llama-perplexity llama-tokenize`):

  PYTHONPATH=/tmp/llamacpp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=/tmp/llamacpp/build/bin \
    /tmp/llamacpp/venv/bin/python bench/reference/archs.py --synth target/release/hearth --only qwen2moe

--synth (default /tmp/hearth-synth, or $HEARTH_SYNTH) must be the hearth binary (`hearth synth`) built from
the commit recorded in the JSON ("hearth_commit", `git rev-parse HEAD` of this checkout when the script ran; with
--only, "_about" is kept and each updated variant records its own "hearth_commit";
when the data were made that was 8353678 "synth --arch llama|qwen2|qwen3|gemma3|phi3 ..."): the random weights
come from its generator, so another build of synth may write different files (compare the sha256).

llama.cpp: the copy vendored in the PyPI source package llama_cpp_python==0.3.36 (ggml-org/llama.cpp@0c1e570
per its CHANGELOG; `llama-completion --version` says "0.5.0-dev (build 1, commit 0c1e570)", ggml 0.25.3), built
at /tmp/llamacpp/build with cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release (gcc 12.2.0) on
a 2-core "AMD EPYC" VM with AVX2 but no AVX-512; llama_print_system_info() says
  CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1
(recorded again in the JSON by the run). The Python bindings (llama_cpp 0.3.36) load that build's libllama.so.

Files: every variant is --type f32 --output-type f32 (so neither engine quantizes activations: llama.cpp's
vec_dot_type for F32 is F32) --n-embd 64 --n-head 4 --n-head-kv 2 --n-ff 128 --n-layer 2 --seed 1
--context-length 4096, with the variant's own flags appended (see VARIANTS); llama_q8_0 is --type q8_0
--output-type q8_0 (the quantized path: llama.cpp quantizes the activations to Q8_0 per 32 for its dot
products). The tokenizer is synth's default (SmolLM2-135M-Instruct's gpt2 vocabulary, models/
SmolLM2-135M-Instruct.Q4_1.gguf) except phi3, which copies the Phi-3 vocabulary from
$HEARTH_REFERENCE_DIR/vocab/ggml-vocab-phi-3.gguf (default ../shared/reference; llama.cpp needs a Phi-3 (llama spm) vocabulary for phi3).

Settings for the prompts (a fresh context per prompt): n_ctx 2048, n_batch = n_ubatch = 2048 (the whole prompt
is one llama_decode), 2 threads (n_threads = n_threads_batch = 2), flash attention on
(LLAMA_FLASH_ATTN_TYPE_ENABLED), KV cache f16 for K and V, swa_full at llama_context_default_params' true.
Tokenization: llama_tokenize with add_special = true (a <bos> is added when the model's add_bos says so),
parse_special = true. Prompts: "short" = "The quick brown fox jumps over the lazy dog." and "long" = the first
3000 bytes of smollm2/ppl_gpl3.txt (ASCII; long enough that positions reach several hundred, where RoPE
scaling matters).
Generation: greedy, argmax over the raw logits (numpy argmax: the lowest id wins a tie), exactly 16 tokens,
one token decoded per step, NOT stopping at an end-of-generation token (random weights; eog ids are in
"vocab"). per_step_top2[i] is the two largest [[id, logit], [id, logit]] of the distribution generated_ids[i]
was taken from (step 0: the last prompt position, so per_step_top2[0] == top100_last[:2]).

Perplexity: llama-perplexity -m FILE -f ppl_gpl3.txt -c 128 -t 2 -fa on (the exact command line is stored).

What the data can tell apart (from the run that made them): random weights give nearly flat logits (top-1
about 0.6, perplexity about n_vocab). llama_linear / llama_yarn have llama's weights (only the RoPE metadata
differs) and move its top-100 logits by at most ~2e-3 (their greedy tokens equal llama's); llama_q8_0 moves them
by ~4e-3; llama_rope_freqs draws different weights (one more tensor), so it is not comparable to llama. A test
that is to catch a wrong RoPE scaling needs a logit tolerance well under 1e-3. Some greedy steps have a top-2
margin of ~1e-6 (llama_linear "long"), so compare per_step_top2 with a margin check rather than tokens blindly.
qwen2_tied repeats the last prompt token (the tied head sees the input embedding in the residual).

If llama.cpp refuses a variant (load or decode failure), its error is recorded under "error" and the script
goes on with the next variant.
"""

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma3 import LLAMA_BIN, N_THREADS, PPL_TEXT, REFERENCE, ROOT, last_logits, load, sha256  # noqa: E402

OUT = os.path.join(ROOT, "crates", "model", "tests", "data", "archs.json")
TMP = "/tmp/hearth-archs"
N_PREDICT = 16
TOP_N = 100
LONG_BYTES = 3000
PPL_CTX = 128
PHI3_VOCAB = os.path.join(os.path.abspath(REFERENCE), "vocab", "ggml-vocab-phi-3.gguf")

BASE = ["--type", "f32", "--output-type", "f32", "--n-embd", "64", "--n-head", "4", "--n-head-kv", "2",
        "--n-ff", "128", "--n-layer", "2", "--seed", "1", "--context-length", "4096"]


def override(args, **kv):
    """BASE with some flags' values replaced (flags given as python names: n_layer -> --n-layer)."""
    args = list(args)
    for k, v in kv.items():
        flag = "--" + k.replace("_", "-")
        args[args.index(flag) + 1] = str(v)
    return args


VARIANTS = {
    "llama": ["--arch", "llama"] + BASE,
    "llama_rope_freqs": ["--arch", "llama"] + BASE + ["--rope-freqs"],
    "llama_linear": ["--arch", "llama"] + BASE + ["--rope-scaling", "linear", "--rope-scale", "4"],
    "llama_yarn": ["--arch", "llama"] + BASE + ["--rope-scaling", "yarn", "--rope-scale", "4",
                                                "--rope-orig-ctx", "1024"],
    "qwen2": ["--arch", "qwen2"] + BASE,
    "qwen2_tied": ["--arch", "qwen2"] + BASE + ["--tied"],
    "qwen3": ["--arch", "qwen3"] + BASE + ["--head-dim", "32"],
    "gemma3": ["--arch", "gemma3"] + override(BASE, n_layer=6) + ["--head-dim", "32"],
    # Gemma 3 4B-27B scale positions linearly (factor 8) on their global layers only.
    "gemma3_linear": ["--arch", "gemma3"] + override(BASE, n_layer=6) + ["--head-dim", "32", "--rope-scaling", "linear",
                                                                          "--rope-scale", "8"],
    "phi3": ["--arch", "phi3"] + BASE + ["--tokenizer-from", PHI3_VOCAB],
    # Trained (and so original) context 1024 < the prompts' n_ctx 2048: the long LongRoPE factors.
    "phi3_long": ["--arch", "phi3"] + override(BASE, context_length=1024) + ["--tokenizer-from", PHI3_VOCAB],
    "llama_q8_0": ["--arch", "llama"] + override(BASE, type="q8_0", output_type="q8_0"),
    # Mixtures of experts (issue #21): 8 experts, Qwen3-MoE 4 of them per token (32 wide),
    # Mixtral 2 (--n-ff wide).
    "qwen3moe": ["--arch", "qwen3moe"] + BASE + ["--head-dim", "32", "--n-expert", "8", "--n-expert-used", "4",
                                                 "--n-ff-exp", "32"],
    "mixtral": ["--arch", "mixtral"] + BASE + ["--n-expert", "8", "--n-expert-used", "2"],
    # Qwen2-MoE: Qwen2's attention, 8 experts of 32, 4 per token (weights not renormalised),
    # and a shared expert 64 wide (neither the experts' nor --n-ff's width).
    "qwen2moe": ["--arch", "qwen2moe"] + BASE + ["--n-expert", "8", "--n-expert-used", "4", "--n-ff-exp", "32",
                                                 "--n-ff-shexp", "64"],
}

PROMPTS = [
    ("short", "The quick brown fox jumps over the lazy dog.", None),
    ("long", None, LONG_BYTES),
]


def synth(synth_bin, args, out):
    # From the repository root without $HEARTH_MODEL: synth's default tokenizer is then
    # models/SmolLM2-135M-Instruct.Q4_1.gguf.
    env = {k: v for k, v in os.environ.items() if k != "HEARTH_MODEL"}
    cmd = [synth_bin, "synth"] + args + ["--out", out]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env)


def topk(logits, k):
    idx = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(logits[i])] for i in idx]


def run_prompt(model, text):
    m = load(model)
    prompt_ids = m.tokenize(text.encode(), add_bos=True, special=True)
    assert len(prompt_ids) + N_PREDICT <= 2048, len(prompt_ids)
    m.eval(prompt_ids)  # n_batch >= len(prompt): one llama_decode
    logits = last_logits(m)
    rec = {"n_prompt_tokens": len(prompt_ids), "prompt_ids": prompt_ids, "top100_last": topk(logits, TOP_N)}
    generated, top2 = [], []
    for step in range(N_PREDICT):
        top2.append(topk(logits, 2))
        tok = int(np.argmax(logits))
        generated.append(tok)
        if step + 1 < N_PREDICT:
            m.eval([tok])
            logits = last_logits(m)
    rec["generated_ids"] = generated
    rec["per_step_top2"] = top2
    ties = [i for i, t in enumerate(top2) if t[0][1] == t[1][1]]
    if ties:
        rec["argmax_ties_at_steps"] = ties
    del m
    return rec


def model_info(model):
    vm = load(model, vocab_only=True)
    vocab = llama_cpp.llama_model_get_vocab(vm.model)
    n_vocab = vm.n_vocab()
    info = {
        "n_vocab": n_vocab,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog_ids": [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)],
    }
    del vm
    return info


def perplexity(model):
    cmd = [os.path.join(LLAMA_BIN, "llama-perplexity"), "-m", model, "-f", PPL_TEXT,
           "-c", str(PPL_CTX), "-t", str(N_THREADS), "-fa", "on"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = out.stdout + out.stderr
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", log)
    shown = " ".join(cmd)
    if out.returncode != 0 or not final or not chunks:
        return {"command": shown, "error": f"exit {out.returncode}: " + log_errors(log)}
    return {
        "command": shown,
        "ppl": float(final.group(1)),
        "ppl_plus_minus": float(final.group(2)),
        "chunks": int(chunks.group(1)),
        "n_ctx": int(chunks.group(2)),
        "batch_size": int(chunks.group(3)),
        "n_seq": int(chunks.group(4)),
        "running_ppl_per_chunk": [float(v) for v in re.findall(r"\[\d+\]([0-9.]+),", log)],
    }


def log_errors(log):
    lines = [l for l in log.splitlines() if re.search(r"error|failed|unknown|invalid|abort|assert", l, re.I)]
    return "\n".join(lines[-8:]) if lines else log[-1500:]


def load_error(model):
    """llama.cpp's own words when the bindings cannot load a file (they only raise a generic ValueError)."""
    cmd = [os.path.join(LLAMA_BIN, "llama-tokenize"), "-m", model, "-p", "x"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    return log_errors(out.stdout + out.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth", default=os.environ.get("HEARTH_SYNTH", "/tmp/hearth-synth"))
    ap.add_argument("--only", help="comma-separated variant names (updates those entries of an existing JSON)")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(VARIANTS)
    os.makedirs(TMP, exist_ok=True)
    long_bytes = open(PPL_TEXT, "rb").read()[:LONG_BYTES]
    long_text = long_bytes.decode("ascii")

    doc = {}
    if args.only and os.path.exists(OUT):
        doc = json.load(open(OUT))
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # With --only the other variants' data stay as they were, and so does "_about" (whose
    # hearth_commit is theirs): each updated entry records its own hearth_commit.
    about = {
        "description": "llama.cpp's outputs on tiny random-weight GGUF files written by hearth's synth "
                       "(data, produced by bench/reference/archs.py; see its header for the exact settings). "
                       "Regenerate a file with `hearth synth <synth_args> --out FILE` and check its sha256.",
        "hearth_commit": commit,
        "synth_binary": args.synth,
        "llama_cpp": "llama_cpp_python 0.3.36 vendored llama.cpp (ggml-org/llama.cpp@0c1e570, ggml 0.25.3), "
                     "GGML_NATIVE=ON, 2-core AMD EPYC VM (AVX2, no AVX-512)",
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "settings": {
            "n_ctx": 2048, "n_batch": 2048, "n_ubatch": 2048, "threads": N_THREADS, "flash_attn": True,
            "type_k": "f16", "type_v": "f16", "swa_full": True, "prompt": "one llama_decode",
            "tokenize": "add_special=true (add_bos per the model), parse_special=true",
            "generation": f"greedy argmax of raw logits (lowest id on a tie), exactly {N_PREDICT} tokens, one "
                          "per step, no stop at end-of-generation",
            "top100_last": "[[id, logit], ...], the 100 largest logits at the last prompt position, descending",
            "per_step_top2": "per generated token, the 2 largest [[id, logit], [id, logit]] of the distribution "
                             "it was taken from (step 0 = last prompt position)",
        },
        "tokenizer": "synth's default (run from the repository root, $HEARTH_MODEL unset): "
                     "models/SmolLM2-135M-Instruct.Q4_1.gguf; phi3: --tokenizer-from the shared reference dir's "
                     "vocab/ggml-vocab-phi-3.gguf (its absolute path on the machine that made the data is in "
                     "synth_args; see tokenizer_from)",
    }
    if not (args.only and "_about" in doc):
        doc["_about"] = about

    for name in names:
        sargs = VARIANTS[name]
        path = os.path.join(TMP, name + ".gguf")
        synth(args.synth, sargs, path)
        synth(args.synth, sargs, path + ".again")
        digest = sha256(path)
        again = sha256(path + ".again")
        os.remove(path + ".again")
        assert digest == again, f"{name}: synth is not deterministic ({digest} vs {again})"
        entry = {"synth_args": sargs, "sha256": digest, "size": os.path.getsize(path)}
        if args.only:
            entry["hearth_commit"] = commit
        if "--tokenizer-from" in sargs:
            tok = sargs[sargs.index("--tokenizer-from") + 1]
            entry["tokenizer_from"] = {"reference_dir_path": os.path.relpath(tok, os.path.abspath(REFERENCE)),
                                       "sha256": sha256(tok)}
        print(f"{name}: {entry['size']} bytes, {digest}", file=sys.stderr)
        try:
            entry["vocab"] = model_info(path)
        except Exception as e:  # noqa: BLE001 - llama.cpp refused the file
            entry["error"] = f"load: {e}: {load_error(path)}"
            print(f"  {entry['error']}", file=sys.stderr)
            entry["perplexity"] = perplexity(path)
            doc[name] = entry
            continue
        entry["prompts"] = {}
        for pname, text, nbytes in PROMPTS:
            if text is None:
                text = long_text
            try:
                rec = run_prompt(path, text)
            except Exception as e:  # noqa: BLE001
                rec = {"error": f"{type(e).__name__}: {e}"}
            rec["text" if nbytes is None else "source"] = (
                text if nbytes is None else {"file": "smollm2/ppl_gpl3.txt", "first_bytes": nbytes})
            entry["prompts"][pname] = rec
            if "error" in rec:
                print(f"  {pname}: {rec['error']}", file=sys.stderr)
            else:
                print(f"  {pname}: {rec['n_prompt_tokens']} tokens -> {rec['generated_ids']}", file=sys.stderr)
        entry["perplexity"] = perplexity(path)
        p = entry["perplexity"]
        print(f"  ppl: {p.get('ppl')} +/- {p.get('ppl_plus_minus')} ({p.get('chunks')} chunks) {p.get('error', '')}",
              file=sys.stderr)
        doc[name] = entry

    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
