#!/usr/bin/env python3
"""llama.cpp's tokenizations of its tokenizer test strings with Gemma 3's vocabulary.

Writes crates/tokenizer/tests/data/gemma3.out: for each string of
shared/reference/vocab/ggml-vocab-llama-spm.gguf.inp (strings separated by "\\n__ggml_vocab_test__\\n"),
one line of the ids llama.cpp gives, each preceded by a space (the format of the suite's .out files),
tokenized with add_special = false, parse_special = false. These ids are llama.cpp's output (data).

How it was run (from the repository root, with the model fetched by scripts/fetch-models.sh gemma3):

  source /tmp/llamacpp/ENV.sh
  /tmp/llamacpp/venv/bin/python bench/reference/gemma3_vocab.py [--model models/gemma-3-270m-q4_k_m.gguf]

llama.cpp and machine: the same as bench/reference/gemma3.py (llama_cpp_python 0.3.36's vendored llama.cpp,
ggml-org/llama.cpp@0c1e570, GGML_NATIVE=ON on a 2-core AVX2 AMD EPYC VM); the tokenizer does not depend on
the CPU. --check-suite first re-tokenizes the suite's own llama-spm vocab and requires its .out exactly,
which checks the splitting and the line format.
"""

import argparse
import ctypes
import os
import sys

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.environ.get("HEARTH_REFERENCE_DIR", os.path.join(ROOT, "..", "shared", "reference"))
VOCAB_DIR = os.path.join(REFERENCE, "vocab")
SEP = "\n__ggml_vocab_test__\n"


def strings(inp):
    text = open(inp, encoding="utf-8").read()
    parts = text.split(SEP)
    assert parts[-1] == "", "the .inp does not end with the separator"
    return parts[:-1]


def tokenize(vocab, text):
    data = text.encode("utf-8")
    n = len(data) + 16
    buf = (llama_cpp.llama_token * n)()
    k = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n, False, False)  # add_special, parse_special
    if k < 0:
        n = -k
        buf = (llama_cpp.llama_token * n)()
        k = llama_cpp.llama_tokenize(vocab, data, len(data), buf, n, False, False)
    assert k >= 0, k
    return list(buf[:k])


def out_text(vocab, cases):
    return "".join("".join(f" {t}" for t in tokenize(vocab, s)) + "\n" for s in cases)


def load_vocab(path):
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    assert model, path
    return model, llama_cpp.llama_model_get_vocab(model)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--check-suite", action="store_true", help="first reproduce ggml-vocab-llama-spm.gguf.out")
    args = ap.parse_args()
    llama_cpp.llama_backend_init()
    inp = os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf.inp")
    cases = strings(inp)

    if args.check_suite:
        model, vocab = load_vocab(os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf"))
        want = open(os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf.out"), encoding="utf-8").read()
        got = out_text(vocab, cases)
        llama_cpp.llama_model_free(model)
        if got != want:
            sys.exit("llama-spm: this script does not reproduce the suite's .out")
        print(f"llama-spm: {len(cases)} strings reproduce ggml-vocab-llama-spm.gguf.out", file=sys.stderr)

    model, vocab = load_vocab(args.model)
    text = out_text(vocab, cases)
    llama_cpp.llama_model_free(model)
    out_dir = os.path.join(ROOT, "crates", "tokenizer", "tests", "data")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gemma3.out"), "w", encoding="utf-8") as f:
        f.write(text)
    print(f"gemma3: {len(cases)} strings -> crates/tokenizer/tests/data/gemma3.out", file=sys.stderr)


if __name__ == "__main__":
    main()
