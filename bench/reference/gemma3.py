#!/usr/bin/env python3
"""Reference data for Gemma 3 270M (Q4_K_M) from llama.cpp.

Everything this script writes is llama.cpp's output (data, not hearth's):
  crates/model/tests/data/gemma3-270m.json               tokens, greedy generations, top-5 logits, perplexity
  crates/model/tests/data/gemma3-270m.p0.last_logits.f32  prompt "p0"'s last-position logits (little-endian f32)

How it was run (from the repository root, with the model fetched by scripts/fetch-models.sh gemma3):

  source /tmp/llamacpp/ENV.sh
  /tmp/llamacpp/venv/bin/python bench/reference/gemma3.py [--model models/gemma-3-270m-q4_k_m.gguf]
  /tmp/llamacpp/venv/bin/python bench/reference/gemma3.py --no-repack --skip-perplexity

--no-repack writes gemma3-270m-norepack.json and gemma3-270m-norepack.p0.last_logits.f32 instead: the same
runs with the weights left in the file's layout (llama_model_params.use_extra_bufts = false), so every matmul
is ggml's plain AVX2 ggml_vec_dot_* per row and token, the kernels hearth reproduces bit for bit
(those are no longer hearth's Q4_K order; the file stays as a record of the plain kernels).

--token-by-token writes gemma3-270m-tokenwise.json and gemma3-270m-tokenwise.p0.last_logits.f32: the default
(repacked) run, but every prompt token is its own llama_decode (m.eval([t])), so every Q4_K matmul takes the
repacked gemv (ggml_gemv_q4_K_8x8_q8_K: one fma per super-block) rather than the gemm of prompt batches
(ggml_gemm_q4_K_8x8_q8_K, whose AVX2 code adds into its f32 accumulators every 64 elements: llama.cpp's own
prompt and decode paths round differently). hearth's Q4_K kernels use the gemv order for every batch size
(crates/model/tests/gemma3.rs, `bit_for_bit_with_llama_cpps_default_kernels`).

llama.cpp: the copy vendored in the PyPI source package llama_cpp_python==0.3.36
(ggml-org/llama.cpp@0c1e570 per its CHANGELOG; the sdist has no .git; `llama-completion --version` says
"0.5.0-dev (build 1, commit 0c1e570)", ggml 0.25.3), built at /tmp/llamacpp/build with
  cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release   (per its CMakeCache.txt; gcc 12.2.0) on a 2-core "AMD EPYC" VM with AVX2 but no AVX-512: llama_print_system_info() says
  CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1
(REPACK: the CPU backend repacks Q4_K weights into its interleaved AVX2 layout, so its dot products
round differently from a plain Q4_K x Q8_K kernel). The Python bindings (llama_cpp, 0.3.36) are the
package's own, loading the libllama.so of that build (LLAMA_CPP_LIB_PATH).

Settings for the prompts: n_ctx 2048, n_batch = n_ubatch = 2048 (each prompt is one batch), 2 threads
(n_threads = n_threads_batch = 2), flash attention on (LLAMA_FLASH_ATTN_TYPE_ENABLED), KV cache f16 for K and
V, swa_full left at llama_context_default_params' true (a full-size SWA cache; the same numbers as the
windowed one), a fresh context per prompt.
Tokenization: llama_tokenize with add_special = true (the model's add_bos adds <bos>), parse_special = true.
Generation: greedy, argmax over the raw logits (numpy argmax: the lowest id wins a tie), one token decoded per
step, at most 32 tokens, stopping after the first end-of-generation token (llama_vocab_is_eog), which is
kept as the last entry of generated_ids.

Perplexity: llama-perplexity -m MODEL -f ppl_gpl3.txt -c 512 -t 2 -fa on, and again with -c 1024 (the
exact command lines are stored in the JSON).
"""

import argparse
import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.environ.get("HEARTH_REFERENCE_DIR", os.path.join(ROOT, "..", "shared", "reference"))
PPL_TEXT = os.path.join(os.path.abspath(REFERENCE), "smollm2", "ppl_gpl3.txt")
OUT_DIR = os.environ.get("HEARTH_REFERENCE_OUT", os.path.join(ROOT, "crates", "model", "tests", "data"))
LLAMA_BIN = os.environ.get("LLAMA_BIN", "/tmp/llamacpp/build/bin")

N_CTX = 2048
N_THREADS = 2
N_PREDICT = 32
LONG_TARGET = (700, 800)  # tokens, more than the 512-position sliding window
PPL_EXTRA = []  # extra llama-perplexity flags (--no-repack)

CPU_FLAGS = "SSE3 SSSE3 AVX AVX2 F16C FMA BMI2 (no AVX-512), GGML_NATIVE=ON, LLAMAFILE, OPENMP, REPACK"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(model, vocab_only=False):
    return llama_cpp.Llama(
        model_path=model,
        vocab_only=vocab_only,
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_ubatch=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        flash_attn=True,
        type_k=llama_cpp.GGML_TYPE_F16,
        type_v=llama_cpp.GGML_TYPE_F16,
        logits_all=False,
        verbose=False,
    )


def render_gemma_chat(user):
    """llama.cpp's built-in "gemma" template (llm_chat_apply_template), one user message + generation prompt."""
    msgs = (llama_cpp.llama_chat_message * 1)()
    msgs[0].role = b"user"
    msgs[0].content = user.encode()
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(b"gemma", msgs, 1, True, buf, len(buf))
    assert 0 < n < len(buf), n
    return buf.raw[:n].decode()


def last_logits(m):
    ptr = llama_cpp.llama_get_logits_ith(m.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(m.n_vocab(),)).astype(np.float32, copy=True)


def top5(logits):
    idx = np.argsort(-logits, kind="stable")[:5]
    return [[int(i), float(logits[i])] for i in idx]


def run_prompt(model, text, tokenwise=False):
    m = load(model)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    prompt_ids = m.tokenize(text.encode(), add_bos=True, special=True)
    assert len(prompt_ids) <= N_CTX
    if tokenwise:
        for t in prompt_ids:
            m.eval([t])  # one llama_decode per prompt token
    else:
        m.eval(prompt_ids)  # n_batch >= len(prompt): one llama_decode
    logits = last_logits(m)
    first = logits.copy()
    generated, ties, stopped = [], [], False
    for step in range(N_PREDICT):
        order = np.argsort(-logits, kind="stable")[:2]
        if logits[order[0]] == logits[order[1]]:
            ties.append(step)
        tok = int(np.argmax(logits))
        generated.append(tok)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            stopped = True
            break
        if step + 1 < N_PREDICT:
            m.eval([tok])
            logits = last_logits(m)
    rec = {
        "prompt_ids": prompt_ids,
        "generated_ids": generated,
        "generated_text": m.detokenize(generated).decode("utf-8", errors="replace"),
        "stopped_at_eog": stopped,
        "top5_last_prompt_pos": top5(first),
    }
    if ties:
        rec["argmax_ties_at_steps"] = ties
    del m
    return rec, first


def long_prompt(model):
    """The first N bytes of ppl_gpl3.txt, cut at a line end, that tokenize to 700-800 tokens (with <bos>)."""
    m = load(model, vocab_only=True)
    data = open(PPL_TEXT, "rb").read()
    best = None
    for nl in re.finditer(b"\n", data):
        n = nl.end()
        k = len(m.tokenize(data[:n], add_bos=True, special=True))
        if k > LONG_TARGET[1]:
            break
        if k >= LONG_TARGET[0] and (best is None or abs(k - 750) < abs(best[1] - 750)):
            best = (n, k)
    assert best, "no line end gives 700-800 tokens"
    return best[0], data[: best[0]].decode()


def perplexity(model, ctx):
    cmd = [os.path.join(LLAMA_BIN, "llama-perplexity"), "-m", model, "-f", PPL_TEXT,
           "-c", str(ctx), "-t", str(N_THREADS), "-fa", "on"] + PPL_EXTRA
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    log = out.stdout + out.stderr
    final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", log)
    running = re.findall(r"\[(\d+)\]([0-9.]+),", log)
    assert final and chunks, log[-3000:]
    return {
        "command": " ".join(cmd),
        "method": "llama-perplexity's default: the text's tokens (with <bos> per add_bos) cut into chunks of n_ctx, "
                  "each chunk's first token set to <bos>, n_seq chunks per batch, the second half of each chunk "
                  "scored; KV cache f16 (default); -fa on is the flash-attention flag of this build",
        "n_ctx": ctx,
        "ppl": float(final.group(1)),
        "ppl_plus_minus": float(final.group(2)),
        "chunks": int(chunks.group(1)),
        "batch_size": int(chunks.group(3)),
        "n_seq": int(chunks.group(4)),
        "running_ppl_per_chunk": [float(v) for _, v in running],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--skip-perplexity", action="store_true", help="(for trying the script out) no perplexity runs")
    ap.add_argument("--no-repack", action="store_true",
                    help="load weights without the CPU backend's repacked (interleaved) buffers: "
                         "llama_model_params.use_extra_bufts = false, llama-perplexity --no-repack")
    ap.add_argument("--token-by-token", action="store_true",
                    help="one llama_decode per prompt token (the decode kernels for every token); no perplexity")
    args = ap.parse_args()
    assert not (args.no_repack and args.token_by_token), "one of --no-repack, --token-by-token"
    if args.token_by_token:
        args.skip_perplexity = True
    if args.no_repack:
        # llama_cpp.Llama reads its defaults through the module llama_cpp.llama_cpp.
        import llama_cpp.llama_cpp as low
        default = low.llama_model_default_params

        def no_extra_bufts():
            p = default()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = no_extra_bufts
        PPL_EXTRA.append("--no-repack")
    model = args.model
    os.makedirs(OUT_DIR, exist_ok=True)
    stem = "gemma3-270m-norepack" if args.no_repack else "gemma3-270m-tokenwise" if args.token_by_token else "gemma3-270m"

    vm = load(model, vocab_only=True)
    vocab = llama_cpp.llama_model_get_vocab(vm.model)
    n_vocab = vm.n_vocab()
    eog = [i for i in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    meta = {
        "n_vocab": n_vocab,
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "eog_ids": eog,
    }
    del vm

    n_long, long_text = long_prompt(model)
    prompts = [
        {"name": "p0", "text": "The capital of France is"},
        {"name": "code", "text": "def fibonacci(n):\n"},
        {"name": "chat", "text": render_gemma_chat("What is 2+2?"),
         "chat": {"template": "llama.cpp built-in \"gemma\" (llama_chat_apply_template, add_ass=true)",
                  "messages": [{"role": "user", "content": "What is 2+2?"}]}},
        {"name": "long", "text": long_text, "source": {"file": "smollm2/ppl_gpl3.txt", "bytes": n_long}},
    ]
    for p in prompts:
        rec, logits = run_prompt(model, p["text"], args.token_by_token)
        p.update(rec)
        print(f"{p['name']}: {len(p['prompt_ids'])} prompt tokens -> {p['generated_text']!r}", file=sys.stderr)
        if p["name"] == "p0":
            raw = logits.astype("<f4").tobytes()
            assert len(raw) < int(1.1e6), len(raw)
            with open(os.path.join(OUT_DIR, f"{stem}.p0.last_logits.f32"), "wb") as f:
                f.write(raw)
            p["last_logits_file"] = f"{stem}.p0.last_logits.f32"

    doc = {
        "description": "llama.cpp's outputs on Gemma 3 270M Q4_K_M (data, produced by bench/reference/gemma3.py; "
                       "see its header for the exact settings).",
        "model": {"file": os.path.basename(model), "sha256": sha256(model)},
        "llama_cpp": f"llama_cpp_python 0.3.36 vendored llama.cpp (ggml-org/llama.cpp@0c1e570, ggml 0.25.3), "
                     f"CPU flags {CPU_FLAGS}; 2-core AMD EPYC VM",
        "vocab": meta,
        "settings": {
            "n_ctx": N_CTX, "n_batch": N_CTX, "n_ubatch": N_CTX, "threads": N_THREADS,
            "flash_attn": True, "type_k": "f16", "type_v": "f16", "swa_full": True,
            "repack": not args.no_repack,
            "prompt_eval": "one llama_decode per token" if args.token_by_token else "one llama_decode",
            "tokenize": "add_special=true, parse_special=true",
            "generation": f"greedy argmax of raw logits, one token per step, n_predict {N_PREDICT}, "
                          "stop after an end-of-generation token (kept in generated_ids); "
                          "generated_text = detokenize(generated_ids) without special tokens",
            "top5_last_prompt_pos": "[[id, logit], ...], the 5 largest logits at the last prompt position",
        },
        "prompts": prompts,
    }
    if not args.skip_perplexity:
        doc["perplexity"] = [perplexity(model, c) for c in (512, 1024)]
        for r in doc["perplexity"]:
            print(f"ppl -c {r['n_ctx']}: {r['ppl']} +/- {r['ppl_plus_minus']} ({r['chunks']} chunks)", file=sys.stderr)
    with open(os.path.join(OUT_DIR, f"{stem}.json"), "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
