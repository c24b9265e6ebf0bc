#!/usr/bin/env python3
"""F32 reference data for Gemma 3 270M from llama.cpp (the Q4_K_M file with every tensor dequantized to f32).

Why: with Q4_K_M weights llama.cpp's CPU kernels quantize the activations (Q8_K / Q8_0 per row) before the
dot products, and hearth rounds those differently, so their logits differ by up to ~0.3. With F32 weights
neither side quantizes activations (llama.cpp's vec_dot_type for F32 is F32), so what is left between hearth
and this file is summation-order noise plus the f16 KV cache (and, in llama.cpp's CPU flash attention, Q
converted to f16 for the Q.K dot products) -- or an architecture mistake.

Everything this script writes is llama.cpp's output (data, not hearth's):
  crates/model/tests/data/gemma3-270m-f32.json   top-100 logits at the last prompt position, greedy
                                                 generations with the top-2 logits of every step, perplexity

How it was run (from the repository root, with models/gemma-3-270m-q4_k_m.gguf fetched by
scripts/fetch-models.sh gemma3):

  mkdir -p /tmp/gem
  /tmp/llamacpp/build/bin/llama-quantize --allow-requantize models/gemma-3-270m-q4_k_m.gguf \\
      /tmp/gem/gemma3-270m-f32.gguf F32
  source /tmp/llamacpp/ENV.sh
  /tmp/llamacpp/venv/bin/python bench/reference/gemma3_f32.py [--model /tmp/gem/gemma3-270m-f32.gguf]

llama-quantize to F32 dequantizes each of the 127 quantized tensors (token_embd q8_0, attn_q/k/ffn_gate/up
q5_0, attn_v q8_0, attn_output q4_K, ffn_down q6_K, ...) with ggml's own dequantize_row_* (exact: every
quantized value times its f16 scales, in f32) and copies the 109 1-D f32 norm tensors unchanged; the output
head is tied to token_embd (no output.weight), so it is f32 too. The F32 file is 1,078,917,824 bytes; its
sha256 is stored in the JSON (not in the repository: it is 1 GiB and reproducible from the Q4_K_M file).

llama.cpp build, settings, tokenization, generation: exactly those of bench/reference/gemma3.py (imported
from it; see its header): n_ctx 2048, n_batch = n_ubatch = 2048 (each prompt one llama_decode), 2 threads,
flash attention on, KV cache f16 for K and V, swa_full true, a fresh context per prompt; greedy argmax of the
raw logits (lowest id on a tie), one token per step, at most 32 tokens, stopping after an end-of-generation
token (kept). The prompts are the four of gemma3-270m.json, evaluated from its prompt_ids (the script checks
that tokenizing the texts again gives the same ids).

per_step_top2[i] is the two largest logits [[id, logit], [id, logit]] of the distribution generated_ids[i]
was taken from (step 0: the last prompt position, so per_step_top2[0] == top100_last_prompt_pos[:2]).

Perplexity: llama-perplexity -m /tmp/gem/gemma3-270m-f32.gguf -f ppl_gpl3.txt -c 512 -t 2 -fa on (the exact
command line is stored in the JSON).
"""

import argparse
import json
import os
import shlex
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3  # noqa: E402  (the Q4_K_M script: load(), last_logits(), perplexity(), settings)
import llama_cpp  # noqa: E402

ROOT = gemma3.ROOT
OUT_DIR = gemma3.OUT_DIR
Q4_MODEL = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
F32_MODEL = "/tmp/gem/gemma3-270m-f32.gguf"
Q4_JSON = os.path.join(OUT_DIR, "gemma3-270m.json")
TOPK = 100


def topk(logits, k):
    idx = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(logits[i])] for i in idx]


def run_prompt(model, text, prompt_ids):
    m = gemma3.load(model)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    assert m.tokenize(text.encode(), add_bos=True, special=True) == prompt_ids, "tokenization differs"
    assert len(prompt_ids) <= gemma3.N_CTX
    m.eval(prompt_ids)  # n_batch >= len(prompt): one llama_decode
    logits = gemma3.last_logits(m)
    top100 = topk(logits, TOPK)
    generated, top2, ties, stopped = [], [], [], False
    for step in range(gemma3.N_PREDICT):
        t2 = topk(logits, 2)
        top2.append(t2)
        if t2[0][1] == t2[1][1]:
            ties.append(step)
        tok = int(np.argmax(logits))
        assert tok == t2[0][0]
        generated.append(tok)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            stopped = True
            break
        if step + 1 < gemma3.N_PREDICT:
            m.eval([tok])
            logits = gemma3.last_logits(m)
    rec = {
        "top100_last_prompt_pos": top100,
        "generated_ids": generated,
        "generated_text": m.detokenize(generated).decode("utf-8", errors="replace"),
        "stopped_at_eog": stopped,
        "per_step_top2": top2,
    }
    if ties:
        rec["argmax_ties_at_steps"] = ties
    del m
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=F32_MODEL)
    ap.add_argument("--q4-model", default=Q4_MODEL, help="the Q4_K_M file the F32 one was made from")
    ap.add_argument("--skip-perplexity", action="store_true", help="(for trying the script out) no perplexity run")
    args = ap.parse_args()
    model = args.model

    q4 = json.load(open(Q4_JSON))
    q4_sha = gemma3.sha256(args.q4_model)
    assert q4_sha == q4["model"]["sha256"], "the Q4_K_M file is not the one gemma3-270m.json was made from"

    prompts = []
    for p in q4["prompts"]:
        rec = run_prompt(model, p["text"], p["prompt_ids"])
        out = {"name": p["name"], "prompt_ids": p["prompt_ids"], **rec}
        prompts.append(out)
        same = out["generated_ids"] == p["generated_ids"]
        print(f"{p['name']}: {len(p['prompt_ids'])} prompt tokens -> {out['generated_text']!r}"
              f" (Q4_K_M generation {'identical' if same else 'differs'})", file=sys.stderr)

    conv = ["llama-quantize", "--allow-requantize", "models/gemma-3-270m-q4_k_m.gguf",
            "/tmp/gem/gemma3-270m-f32.gguf", "F32"]
    doc = {
        "description": "llama.cpp's outputs on Gemma 3 270M dequantized to F32 from the Q4_K_M file (data, produced "
                       "by bench/reference/gemma3_f32.py; see its header and bench/reference/gemma3.py's for the "
                       "exact settings). Prompts (names, prompt_ids) are those of gemma3-270m.json.",
        "model": {
            "file": os.path.basename(model),
            "conversion": " ".join(shlex.quote(c) for c in conv)
                          + "  (/tmp/llamacpp/build/bin/llama-quantize, same llama.cpp build)",
            "sha256": gemma3.sha256(model),
            "bytes": os.path.getsize(model),
            "source": {"file": os.path.basename(args.q4_model), "sha256": q4_sha},
        },
        "llama_cpp": q4["llama_cpp"],
        "settings": {
            **q4["settings"],
            "prompts": "evaluated from gemma3-270m.json's prompt_ids (re-tokenizing the texts gives the same ids)",
            "top100_last_prompt_pos": f"[[id, logit], ...], the {TOPK} largest logits at the last prompt position, "
                                      "descending (ties: lower id first)",
            "per_step_top2": "per generation step i, the 2 largest logits [[id, logit], [id, logit]] of the "
                             "distribution generated_ids[i] was the argmax of (step 0 = last prompt position)",
        },
        "prompts": prompts,
    }
    doc["settings"].pop("top5_last_prompt_pos", None)
    if not args.skip_perplexity:
        doc["perplexity"] = [gemma3.perplexity(model, 512)]
        for r in doc["perplexity"]:
            print(f"ppl -c {r['n_ctx']}: {r['ppl']} +/- {r['ppl_plus_minus']} ({r['chunks']} chunks)", file=sys.stderr)
    with open(os.path.join(OUT_DIR, "gemma3-270m-f32.json"), "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
